"""Generated bad input against the three loaders users feed by hand: ``Plan.from_dict``,
``LayerTable.from_dict`` and ``parse_profile``.

Each gets random JSON-like values and mutations of a valid document (a field deleted, replaced
by an extreme or wrongly typed value, an unknown field added). The only acceptable outcomes
are one of the project's own errors (an ``AutoparError`` subclass, one line) or an object that
``estimate`` turns into sane figures: finite, non-negative step time, throughput and MFU. Any
other exception (TypeError, ZeroDivisionError, OverflowError, ...) or a NaN / negative figure is
a bug. Each fuzzer runs at least 1000 examples (``max_examples``) and counts the documents that
loaded, so it cannot pass by refusing everything.
"""
from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_tables import tiny_gpt

from costmodels.contracts.errors import AutoparError, PlanError, ProfileError, SpecError
from costmodels.contracts.files import tomllib
from costmodels.contracts.layer_table import LayerTable
from costmodels.contracts.plan import PLAN_FIELDS, Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import PROFILES_DIR, load_profile, parse_profile

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

EXTREMES = st.sampled_from([0, -1, 1, 2, 3, 8, 1.5, -0.0, 5e-324, 1e-300, 1e308, 2 ** 63, 10 ** 30,
                            math.nan, math.inf, -math.inf, True, False, None, "", "1", "none", [],
                            {}, [0, 4], [[0, 1]], {"value": 1}])
SCALARS = (st.none() | st.booleans() | st.integers(-10 ** 20, 10 ** 20)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | EXTREMES)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)

TABLE = tiny_gpt()
A100 = load_profile("a100-80g-sxm")
PROFILE_DOC = tomllib.loads((PROFILES_DIR / "a100-80g-sxm.toml").read_text())
CPU_DOC = tomllib.loads((PROFILES_DIR / "cpu-2core-measured.toml").read_text())


FACTORS = st.sampled_from([0, 1e-320, 1e-300, 1e-9, 0.5, 2, 1e9, 1e15, 1e300])


def _scaled(value, f):
    """``value`` times ``f``, keeping an int an int (where it stays below 2**63)."""
    v = value * f
    return int(v) if isinstance(value, int) and math.isfinite(v) and abs(v) < 2 ** 63 else v


def _keys(node) -> set:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, (list, tuple)):
        return {k for v in node for k in _keys(v)}
    return set()


def _scale_key(node, key, f) -> None:
    """Scale every number stored under ``key`` anywhere in ``node`` (every row's fwd_flops, every
    figure's value, ...): the whole-document extremes one edit cannot reach."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, (int, float)) and not isinstance(v, bool):
                node[k] = _scaled(v, f)
            else:
                _scale_key(v, key, f)
    elif isinstance(node, list):
        for v in node:
            _scale_key(v, key, f)


def _leaves(node, path=()):
    """Paths to every scalar in ``node``: each field is then as likely to be edited as any."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
    if items is None:
        return [path]
    return [p for k, v in items for p in _leaves(v, (*path, k))]


def mutate(doc, draw, max_edits: int = 3, scale_only: bool = False):
    """``doc`` with 1..max_edits edits: scale one number, or every number under one key, by an
    extreme factor (same type); replace a scalar by an extreme or random value; delete a key, add
    an unknown one, or nest a value one level deeper."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, max_edits))):
        action = "scale" if scale_only else draw(st.sampled_from(
            ["scale", "scale", "scale", "scale_key", "extreme", "replace", "delete", "add", "wrap"]))
        if action == "scale_key":
            keys = sorted(str(k) for k in _keys(doc))
            if keys:
                _scale_key(doc, draw(st.sampled_from(keys)), draw(FACTORS))
            continue
        leaves = [p for p in _leaves(doc) if p]
        if not leaves:
            continue
        path = draw(st.sampled_from(leaves))
        if action in ("delete", "add", "wrap"):           # structure: act on a containing node
            path = path[:draw(st.integers(1, len(path)))]
        node = doc
        for k in path[:-1]:
            node = node[k]
        k, child = path[-1], node[path[-1]]
        if action == "scale":
            if isinstance(child, (int, float)) and not isinstance(child, bool):
                node[k] = _scaled(child, draw(FACTORS))
        elif action == "extreme":   # copies: sampled_from hands out the same list / dict objects,
            node[k] = copy.deepcopy(draw(EXTREMES))   # which an edit could make contain themselves
        elif action == "replace":
            node[k] = copy.deepcopy(draw(JSON))
        elif action == "delete" and isinstance(node, dict):
            del node[k]
        elif action == "add" and isinstance(node, dict):
            node[draw(st.text(min_size=1, max_size=12))] = copy.deepcopy(draw(SCALARS))
        else:
            node[k] = [child]
    return doc


def assert_sane(est) -> None:
    """Every figure an estimate reports is a finite, non-negative number (and the step takes
    time): what a user reads and the search ranks by."""
    d = est.to_dict()
    figures = {k: d[k] for k in ("step_time_s", "tokens_per_s", "mfu", "tflops_per_gpu", "bubble_fraction")}
    for group in ("memory_bytes", "breakdown_s", "comm_bytes"):
        figures.update({f"{group}.{k}": v for k, v in d[group].items()})
    for key, v in figures.items():
        assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, (key, v)
    assert d["step_time_s"] > 0


def one_line(e: AutoparError) -> None:
    msg = str(e)
    assert msg and "\n" not in msg and len(msg) < 1500, msg[:300]


# ---------------------------------------------------------------------------- Plan.from_dict
PLAN_VALUES = {"dp": st.integers(1, 4), "tp": st.sampled_from([1, 2, 4]), "pp": st.integers(1, 3),
               "vpp": st.integers(1, 2), "micro_batch_size": st.integers(1, 4), "zero": st.integers(0, 3),
               "recompute": st.sampled_from(["none", "selective", "full"]),
               "sequence_parallel": st.booleans(), "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]),
               "attention": st.sampled_from(["flash", "math"])}


@st.composite
def plan_docs(draw):
    kind = draw(st.sampled_from(["valid-ish", "mutated", "random"]))
    if kind == "random":
        return draw(st.dictionaries(st.sampled_from([*PLAN_FIELDS, "version", "x"]) | st.text(max_size=8),
                                    JSON, max_size=5) | JSON)
    doc = {k: draw(v) for k, v in PLAN_VALUES.items() if draw(st.booleans())}
    return mutate(doc, draw, 2) if kind == "mutated" and doc else doc


loaded = {"plan": 0, "table": 0, "profile": 0}


@FUZZ
@given(doc=plan_docs(), k=st.integers(1, 3))
def test_plan_from_dict_fuzz(doc, k):
    try:
        plan = Plan.from_dict(doc)
    except PlanError as e:
        return one_line(e)
    loaded["plan"] += 1
    try:
        est = estimate(TABLE, A100, plan, plan.world_size, plan.dp * plan.micro_batch_size * k * plan.pp)
    except AutoparError as e:          # e.g. tp does not divide the heads, too many stages
        return one_line(e)
    assert_sane(est)


# ------------------------------------------------------------------------ LayerTable.from_dict
def table_json(table: LayerTable, inspect: bool = False) -> dict:
    """The table as JSON gives it (lists, not tuples): ``to_dict()``'s or ``inspect --json``'s."""
    d = json.loads(table.to_json())
    if inspect:
        d["num_layers"], d["layers"] = d["layers"], d.pop("rows")
    return d


@st.composite
def table_docs(draw):
    kind = draw(st.sampled_from(["to_dict", "inspect", "scaled", "random"]))
    if kind == "random":
        return draw(JSON)
    doc = table_json(TABLE, inspect=kind == "inspect")
    return mutate(doc, draw, scale_only=kind == "scaled")


@FUZZ
@given(doc=table_docs())
def test_layer_table_from_dict_fuzz(doc):
    try:
        table = LayerTable.from_dict(doc)
    except SpecError as e:
        return one_line(e)
    loaded["table"] += 1
    for plan in (Plan(), Plan(tp=2, sequence_parallel=True, recompute="selective"), Plan(pp=2, zero=1)):
        try:
            est = estimate(table, A100, plan, plan.world_size, table.micro_batch * 4)
        except AutoparError as e:
            one_line(e)
            continue
        assert_sane(est)


# --------------------------------------------------------------------------------- parse_profile
@st.composite
def profile_docs(draw):
    kind = draw(st.sampled_from(["a100", "cpu", "scaled", "random"]))
    if kind == "random":
        return draw(JSON)
    return mutate(CPU_DOC if kind == "cpu" else PROFILE_DOC, draw, scale_only=kind == "scaled")


@FUZZ
@given(doc=profile_docs())
def test_parse_profile_fuzz(doc):
    try:
        profile = parse_profile(doc, "fuzz.toml")
    except ProfileError as e:
        return one_line(e)
    loaded["profile"] += 1
    for plan in (Plan(dp=2), Plan(tp=2, pp=2, sequence_parallel=True)):
        try:
            est = estimate(TABLE, profile, plan, plan.world_size, 8)
        except AutoparError as e:
            one_line(e)
            continue
        assert_sane(est)


@pytest.mark.parametrize("name", ["plan", "table", "profile"])
def test_each_fuzzer_loaded_some_documents(name):
    """Run after the fuzzers (file order): a fuzzer whose every document was refused tested
    only the refusals. Alone (-k), the fuzzer has not run and there is nothing to check."""
    if sum(loaded.values()) == 0:
        pytest.skip("run with the fuzz tests above")
    assert loaded[name] >= 50, loaded
