"""The plans file: the contract between search and apply, with one reader and one writer.

``autopar search -o`` writes it; ``autopar validate -o`` writes it with the measurements beside
the predictions; ``autopar report``, ``explain``, ``estimate``, ``verify``, ``apply``, ``validate
--plans`` and the runtime (``load_plan``) read it (docs/CONTRACTS.md, "Plans file"). All of them
go through ``PlansFile.read`` so that they accept the same inputs and turn bad ones into the same
one-line ``PlanError``, and through ``PlansFile.write`` so that every file is written atomically.

``PlansFile.read(source)`` accepts

* a plans file ``{"version": 1, "model": ..., "plans": [...]}``, as a path, JSON text or a dict;
* one result: an *estimate result* (it holds ``step_time_s``; its other keys are kept beside the
  plan) or a *bare plan* (plan fields and ``rank`` only, any other key is a PlanError);
* an array / list of results, ``Plan`` or ``PlanResult`` objects;
* a ``Plan``, a ``PlanResult`` or a ``PlansFile`` (returned as is).

Estimate results keep every key because those keys are what later layers (estimate, validate)
wrote and the file must carry them unchanged; a bare plan has nothing beside its fields, so an
unknown key there is a typo the user must hear about. Unknown top-level keys (``hardware_path``,
sections a later tool adds) are kept in ``extra``, and a rewrite keeps the keys' order: reading
and writing a file changes nothing. Torch-free, like the rest of ``costmodels``.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from costmodels.contracts.checks import quote, shorten
from costmodels.contracts.errors import AutoparError, PlanError
from costmodels.contracts.files import write_text_atomic
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_checks import check_estimate, check_header

PLANS_FILE_VERSION = 1
PLAN_FIELDS = tuple(f.name for f in fields(Plan))
LATER_FIELDS = ("runtime",)   # plan fields added after plans files were first written
CONTEXT_KEYS = ("model", "hardware", "gpus", "global_batch", "seq")
HEADER_KEYS = ("version", *CONTEXT_KEYS, "objective", "optimal", "search_time_s")
SECTION_KEYS = ("search", "validate")        # written after "plans"
ESTIMATE_KEY = "step_time_s"                 # what makes a result an estimate, not a bare plan
HINT = ("pass a file written by 'autopar search -o' or 'autopar estimate --json', a plan object "
        "or an array of plans")
_JSON_NAMES = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null",
               list: "array", dict: "object"}


@dataclass
class PlanResult:
    """One plan of a plans file and everything written beside it (the estimate, the context,
    validate's measured figures, ``rank``), kept apart so that the plan is only plan fields."""

    plan: Plan
    values: dict[str, Any] = field(default_factory=dict)
    position: int = 1            # 1-based place in the file: the rank when it names none
    # plan fields the source did not write and that hold their default (a file written before a
    # field existed, e.g. 'runtime'): left out again when written, so a rewrite changes nothing
    absent: frozenset = frozenset()

    @property
    def rank(self) -> int:
        r = self.values.get("rank")
        return r if isinstance(r, int) and not isinstance(r, bool) else self.position

    @property
    def has_estimate(self) -> bool:
        return ESTIMATE_KEY in self.values

    def to_dict(self) -> dict[str, Any]:
        """As the plans file holds it: the plan's fields, then everything beside them."""
        d = self.plan.to_dict()
        if self.absent:
            default = Plan().to_dict()
            d = {k: v for k, v in d.items() if not (k in self.absent and v == default[k])}
        d.update(self.values)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], position: int = 1) -> PlanResult:
        """Split an estimate result into plan fields and the rest; a bare plan (no
        ``step_time_s``) may hold plan fields and ``rank`` only (``Plan.from_dict`` names an
        unknown key and the allowed fields)."""
        if not isinstance(d, dict):
            raise PlanError(f"a plan must be a JSON object, got a JSON {_json_name(d)}")
        if ESTIMATE_KEY in d:
            plan = Plan.from_dict({k: v for k, v in d.items() if k in PLAN_FIELDS})
            absent = frozenset(k for k in LATER_FIELDS if k not in d)
            return cls(plan, {k: v for k, v in d.items() if k not in PLAN_FIELDS}, position, absent)
        plan = Plan.from_dict({k: v for k, v in d.items() if k != "rank"})
        return cls(plan, {"rank": d["rank"]} if "rank" in d else {}, position)


@dataclass
class PlansFile:
    """A plans file: its context (model, hardware, ...: None where the input does not say),
    how it was made (``search`` / ``validate`` sections) and its ``results``, best first."""

    results: list[PlanResult]
    model: str | None = None
    hardware: str | None = None
    gpus: int | None = None          # the most GPUs allowed; each result says its own
    global_batch: int | None = None
    seq: int | None = None
    objective: str | None = None
    optimal: bool | None = None
    search_time_s: float | None = None
    search: dict | None = None       # how the search went (autopar search)
    validate: dict | None = None     # summary and method (autopar validate)
    extra: dict[str, Any] = field(default_factory=dict)   # other top-level keys, as read
    version: int = PLANS_FILE_VERSION
    source: str = "<input>"          # the path it was read from, or a <label>: for messages
    form: str = "plans file"         # what was read: "plans file", "array" or "object"
    key_order: tuple[str, ...] = ()  # top-level keys as read, so that a rewrite keeps them

    # ---- reading ------------------------------------------------------------------------
    @classmethod
    def read(cls, source: Any, *, label: str | None = None) -> PlansFile:
        """The plans in ``source`` (the forms in the module docstring); ``label`` names a
        dict / list source in messages (a path or JSON text names itself)."""
        if isinstance(source, PlansFile):
            return source
        if isinstance(source, (Plan, PlanResult)):
            r = source if isinstance(source, PlanResult) else PlanResult(source)
            return cls([r], source=label or "<input>", form="object")
        if isinstance(source, (str, os.PathLike)):
            data, where = _load_json(source)
            return cls._from_data(data, label or where)
        if isinstance(source, dict):
            return cls._from_data(source, label or "<input>")
        if isinstance(source, Iterable) and not isinstance(source, (bytes, bytearray)):
            return cls._from_data(list(source), label or "<input>")
        raise PlanError(f"cannot read plans from a {type(source).__name__}; {HINT} (a path, JSON "
                        "text, a dict, a list or a Plan)")

    @classmethod
    def _from_data(cls, data: Any, source: str) -> PlansFile:
        if isinstance(data, dict) and "plans" in data:
            items = data["plans"]
            if not isinstance(items, list):
                raise PlanError(f"'{source}': field 'plans' must be an array of plans; {HINT}")
            check_header(data, source)
            if not items:
                raise PlanError(f"'{source}' holds no plans; re-run the search (it may have found "
                                "none that fit)")
            known = {*HEADER_KEYS, *SECTION_KEYS, "plans"}
            head = {k: data[k] for k in HEADER_KEYS if k in data}
            out = cls([], **head, search=data.get("search"), validate=data.get("validate"),
                      extra={k: v for k, v in data.items() if k not in known}, source=source,
                      key_order=tuple(data))
        elif isinstance(data, dict) and _is_result(data):
            items, out = [data], cls([], source=source, form="object")
        elif isinstance(data, list) and data:
            items, out = data, cls([], source=source, form="array")
        else:
            raise PlanError(f"'{source}' is not a plans file, an estimate result or a plan: "
                            f"{_what(data)}; {HINT}")
        out.results = [out._result(item, i) for i, item in enumerate(items, 1)]
        return out

    def _result(self, item: Any, i: int) -> PlanResult:
        if isinstance(item, PlanResult):
            return item
        if isinstance(item, Plan):
            return PlanResult(item, {}, i)
        where = f"'{self.source}'" + (f" plan {i}" if self.form != "object" else "")
        if not isinstance(item, dict):
            raise PlanError(f"{where} is a JSON {_json_name(item)}, not an object; {HINT}")
        try:
            return PlanResult.from_dict(item, i)
        except PlanError as e:
            if self.form == "object" and self.source.startswith("<"):
                raise                # one plan given as text or a dict: its error says it all
            raise PlanError(f"{where}: {e}") from None

    # ---- what readers use -------------------------------------------------------------------
    @property
    def plans(self) -> list[Plan]:
        return [r.plan for r in self.results]

    @property
    def context(self) -> dict[str, Any]:
        """The file's model, hardware, gpus, global_batch and seq (those it states)."""
        return {k: getattr(self, k) for k in CONTEXT_KEYS if getattr(self, k) is not None}

    def check_estimates(self) -> PlansFile:
        """Self, or PlanError naming the file, the plan and the field, unless every result is an
        estimate that says its context and whose figures are numbers (what report and explain
        compute with)."""
        for i, d in enumerate(self.to_dict(filled=True)["plans"], 1):
            check_estimate(d, f"'{self.source}' plan {i}")
        return self

    # ---- writing ------------------------------------------------------------------------
    def to_dict(self, *, filled: bool = False) -> dict[str, Any]:
        """The plans file as JSON data, keys in the order read (search's order when built).
        ``filled``: each plan also holds the file's context where it lacks it and its ``rank``
        (the view of one plan that report and explain read)."""
        d: dict[str, Any] = {"version": self.version}
        for k in HEADER_KEYS[1:]:
            if getattr(self, k) is not None or k in self.key_order:
                d[k] = getattr(self, k)
        d["plans"] = [{**self.context, **r.to_dict(), "rank": r.rank} if filled else r.to_dict()
                      for r in self.results]
        for k in SECTION_KEYS:
            if getattr(self, k) is not None or k in self.key_order:
                d[k] = getattr(self, k)
        d.update(self.extra)
        if self.key_order:
            first = [k for k in self.key_order if k in d]
            first = first if "version" in first else ["version", *first]
            d = {k: d[k] for k in first + [k for k in d if k not in first]}
        return d

    def to_json(self) -> str:
        """The text ``write`` writes (``autopar search -o``'s format: indent 2, newline)."""
        try:
            return json.dumps(self.to_dict(), indent=2) + "\n"
        except (TypeError, ValueError) as e:
            raise PlanError(f"cannot write the plans of '{self.source}' as JSON ({e}); plans files "
                            "hold JSON values only (numbers, strings, lists, objects)") from None

    def write(self, path: str | os.PathLike, *, create_folder: bool = False) -> None:
        """Write atomically (``costmodels.contracts.files.write_text_atomic``): the text is made first,
        so a value that is not JSON leaves an old file at ``path`` whole, and a reader never
        sees half a file. ``create_folder``: make a missing folder instead of refusing."""
        text = self.to_json()
        try:
            write_text_atomic(path, text, create_folder=create_folder)
        except AutoparError as e:
            raise PlanError(str(e)) from None
        except OSError as e:
            raise PlanError(f"cannot write '{path}' ({e.strerror}); choose a writable path") from None


def load_plans(source: Any) -> list[Plan]:
    """Every plan of whatever ``PlansFile.read`` accepts (also ``autopar.load_plans``)."""
    return PlansFile.read(source).plans


def load_plan(source: Any) -> Plan:
    """The first plan of whatever ``PlansFile.read`` accepts: the best of a search's file, a plan
    file, JSON text, an estimate result (also ``autopar.load_plan``)."""
    return PlansFile.read(source).plans[0]


def _is_result(d: dict) -> bool:
    """One result rather than something else: an estimate, a plan field, or {} (the default
    plan, as ``--plan '{}'``)."""
    return not d or ESTIMATE_KEY in d or any(k in PLAN_FIELDS for k in d)


def _load_json(source: str | os.PathLike) -> tuple[Any, str]:
    """(data, label): JSON text (it starts with '{' or '[') or the JSON in a file."""
    if isinstance(source, str) and source.strip().startswith(("{", "[")):
        text, where = source, "<JSON text>"
    else:
        where = os.fspath(source)
        if not os.path.exists(where):
            raise PlanError(f"'{where}' does not exist; pass the path of a plans file, or JSON text")
        if os.path.isdir(where):
            raise PlanError(f"'{where}' is a directory, not a plans file; {HINT}")
        try:
            with open(where, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise PlanError(f"'{where}' is not a text file, so not a plans file; {HINT}") from None
        except OSError as e:
            raise PlanError(f"cannot read '{where}' ({e.strerror}); {HINT}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys), where
    except json.JSONDecodeError as e:
        raise PlanError(f"'{where}' is not a plans file: not valid JSON ({e.msg} at line {e.lineno} "
                        f"column {e.colno}); fix the JSON or {HINT}") from None
    except RecursionError:
        raise PlanError(f"'{where}' nests arrays or objects too deeply to be a plans file; {HINT}") from None
    except ValueError as e:          # a duplicate key, or an integer of thousands of digits
        why = "it holds an integer of thousands of digits" if "digits" in str(e) else shorten(str(e), 200)
        raise PlanError(f"'{where}' is not a plans file: {why}; fix the JSON or {HINT}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: a repeated key would silently keep its last value."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {quote(dup, 40)} appears twice in one object; keep one")
    return d


def _json_name(x: Any) -> str:
    return _JSON_NAMES.get(type(x), type(x).__name__)


def _what(data: Any) -> str:
    if data == []:
        return "an empty array"
    if isinstance(data, dict):
        return (f"a JSON object with neither 'plans' nor '{ESTIMATE_KEY}', and unknown plan "
                f"field(s) {sorted(data)[:8]} (allowed: {sorted(PLAN_FIELDS)})")
    return f"a JSON {_json_name(data)}"


__all__ = ["PlansFile", "PlanResult", "load_plans", "load_plan", "PLANS_FILE_VERSION", "PLAN_FIELDS", "CONTEXT_KEYS"]
