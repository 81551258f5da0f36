"""The checks of a plans file's values (``costmodels.contracts.plans_file``), each failure one ``PlanError``
line naming the file, the plan and the field.

``check_header`` runs on every read: the top-level fields must have their JSON types, so a reader
can use ``gpus`` as an integer without a traceback. ``check_estimate`` runs where a reader
computes with the predictions (``autopar report``, ``autopar explain``): a plan must say its
context and carry the figures those readers need, as numbers. Reading a plan to run it (the
runtime, verify, validate) needs neither, so a bare plan stays readable there.
"""
from __future__ import annotations

from typing import Any

from costmodels.contracts.breakdown import MEMORY_KEYS
from costmodels.contracts.checks import is_number, quote
from costmodels.contracts.errors import PlanError

# predictions every plan must carry for the report and explain to say anything about it
REQUIRED = ("step_time_s", "tokens_per_s", "memory_bytes", "fits")
CONTEXT_REQUIRED = ("model", "hardware", "gpus", "global_batch")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return is_number(v)       # finite: a report cannot draw NaN or inf


_HEADER_TYPES = {
    "model": (lambda v: isinstance(v, str), "a string (the model spec)"),
    "hardware": (lambda v: isinstance(v, str), "a string (the hardware profile)"),
    "gpus": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "global_batch": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "seq": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "objective": (lambda v: isinstance(v, str), "a string"),
    "optimal": (lambda v: isinstance(v, bool), "true or false"),
    "search_time_s": (_is_number, "a number"),
    "search": (lambda v: isinstance(v, dict), "an object"),
    "validate": (lambda v: isinstance(v, dict), "an object"),
}


def check_header(data: dict[str, Any], source: str) -> None:
    """The version, then the type of each top-level field present (null counts as absent)."""
    version = data.get("version", 1)
    if version != 1 or isinstance(version, bool):
        raise PlanError(f"'{source}' is a version {quote(version)} plans file; this autopar reads "
                        "version 1 — re-run 'autopar search -o' to regenerate it")
    for key, (ok, what) in _HEADER_TYPES.items():
        v = data.get(key)
        if v is not None and not ok(v):
            raise PlanError(f"'{source}': field '{key}'={quote(v)} must be {what}; re-run 'autopar "
                            "search -o' or fix the field")


def check_estimate(d: dict[str, Any], where: str) -> None:
    """One plan (its file's context filled in) as report and explain need it."""
    missing = [k for k in CONTEXT_REQUIRED if d.get(k) is None]
    if missing:
        raise PlanError(f"{where} does not say its {', '.join(missing)}; write plans with "
                        "'autopar search -o' or 'autopar estimate --json', which record them")
    missing = [k for k in REQUIRED if k not in d]
    if missing:
        raise PlanError(f"{where} has no prediction(s) {missing}: it is a bare plan, not an "
                        f"estimate; score it with 'autopar estimate --json' first")
    for k in ("gpus", "global_batch"):
        if not _is_int(d[k]) or d[k] < 1:
            raise PlanError(f"{where}: '{k}'={quote(d[k])} must be a positive integer")
    for k in ("step_time_s", "tokens_per_s"):
        v = d[k]
        if not _is_number(v) or v < 0:
            raise PlanError(f"{where}: '{k}'={quote(v)} must be a non-negative number")
    if not isinstance(d["memory_bytes"], dict) or "total" not in d["memory_bytes"]:
        raise PlanError(f"{where}: 'memory_bytes' must be an object with 'total' and its parts "
                        f"{[k for k in MEMORY_KEYS if k != 'total']}")
    for k in ("breakdown_s", "comm_bytes"):
        if k in d and not isinstance(d[k], dict):
            raise PlanError(f"{where}: '{k}' must be an object")
    for k in ("breakdown_s", "memory_bytes"):        # explain and the charts do arithmetic on these
        for part, v in (d.get(k) or {}).items():
            if not _is_number(v):
                raise PlanError(f"{where}: '{k}.{part}'={quote(v)} must be a number")
    for k in ("mfu", "tflops_per_gpu", "hbm_bytes"):  # optional, but a number when given
        if d.get(k) is not None and not _is_number(d[k]):
            raise PlanError(f"{where}: '{k}'={quote(d[k])} must be a number")
    for k in ("stages_detail", "comm"):
        if k in d and d[k] is not None and not isinstance(d[k], list):
            raise PlanError(f"{where}: '{k}' must be an array")
