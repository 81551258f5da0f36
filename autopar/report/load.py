"""Reading the report's inputs: plans files (``autopar search -o``) and estimate JSON.

Accepted shapes (docs/CONTRACTS.md, "Plans file" and "Estimate result"):

* a plans file ``{"version": 1, "model": ..., "plans": [ {<estimate result>, "rank": 1}, ...]}``;
* one estimate result object (``autopar estimate --json`` for a single plan);
* an array of estimate result objects (``autopar estimate --json`` for an array of plans).

Each plan becomes a ``PlanRecord``: the estimate-result dict (plan fields and predictions), the
file it came from, and its context (model, hardware, gpus, global batch, seq), taken from the
plan itself or, failing that, from the plans file around it. Anything else — not JSON, JSON that
is no plan file, a plan missing a prediction the report needs, plans of different models mixed
without ``allow_mixed`` — raises ``PlanError`` with one line naming the file, the problem and the
fix.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from costmodels.errors import PlanError
from costmodels.estimate import BREAKDOWN_KEYS, MEMORY_KEYS as ESTIMATE_MEMORY_KEYS
from costmodels.plan import Plan

CONTEXT_KEYS = ("model", "hardware", "gpus", "global_batch", "seq")
# predictions every plan must carry for the report to say anything about it
REQUIRED = ("step_time_s", "tokens_per_s", "memory_bytes", "fits")
# the memory parts the report stacks; 'total' is their sum and is shown on its own
MEMORY_KEYS = tuple(k for k in ESTIMATE_MEMORY_KEYS if k != "total")
COMM_KINDS = ("dp", "tp", "pp", "zero")
HINT = "pass a file written by 'autopar search -o' or 'autopar estimate --json'"


@dataclass
class PlanRecord:
    data: dict[str, Any]          # the estimate result as read (plan fields + predictions)
    plan: Plan                    # the validated plan fields
    source: str                   # the file it came from
    file_rank: int                # its rank inside that file (1 = the file's best)
    file_meta: dict[str, Any] = field(default_factory=dict)  # objective, optimal, search_time_s
    id: int = 0                   # 1-based row number in the report's ranked table

    def __getitem__(self, key):
        return self.data[key]

    def get(self, key, default=None):
        return self.data.get(key, default)

    @property
    def model(self) -> str:
        return str(self.data["model"])

    @property
    def gpus(self) -> int:
        return int(self.data["gpus"])

    @property
    def group(self) -> tuple:
        """Plans of one search: same model, hardware, cluster size, batch and sequence."""
        return tuple(self.data.get(k) for k in CONTEXT_KEYS)

    def label(self) -> str:
        return self.plan.label()

    def short(self) -> str:
        return f"#{self.id} {self.label()} ({self.gpus} GPUs)"


def read_inputs(paths: list[str], allow_mixed: bool = False) -> list[PlanRecord]:
    """All plans of all files, ordered by (model, gpus, file, rank) and numbered 1, 2, ..."""
    if not paths:
        raise PlanError(f"no input files; {HINT}")
    records: list[PlanRecord] = []
    for path in paths:
        records.extend(read_file(path))
    models = sorted({r.model for r in records})
    if len(models) > 1 and not allow_mixed:
        where = "; ".join(f"{m} in {', '.join(sorted({r.source for r in records if r.model == m}))}"
                          for m in models)
        raise PlanError(f"the inputs hold plans for different models ({where}); compare one model "
                        "at a time or pass --allow-mixed")
    order = {p: i for i, p in enumerate(paths)}
    records.sort(key=lambda r: (models.index(r.model), r.gpus, str(r.get("hardware")),
                                order.get(r.source, 0), r.file_rank))
    for i, r in enumerate(records, 1):
        r.id = i
    return records


def read_file(path: str) -> list[PlanRecord]:
    return parse(load_json(path), path)


def load_json(path: str) -> Any:
    """The JSON in ``path``, or ``PlanError`` naming the file and what is wrong with it."""
    if not os.path.exists(path):
        raise PlanError(f"'{path}' does not exist; {HINT}")
    if os.path.isdir(path):
        raise PlanError(f"'{path}' is a directory, not a plans file; {HINT}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except UnicodeDecodeError:
        raise PlanError(f"'{path}' is not a text file, so not a plans file; {HINT}") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"'{path}' is not a plans file: not valid JSON ({e.msg} at line {e.lineno} "
                        f"column {e.colno}); {HINT}") from None
    return data


def parse(data: Any, path: str = "<input>") -> list[PlanRecord]:
    meta: dict[str, Any] = {}
    if isinstance(data, dict) and "plans" in data:
        items = data["plans"]
        if not isinstance(items, list):
            raise PlanError(f"'{path}': field 'plans' must be an array of plans; {HINT}")
        version = data.get("version", 1)
        if version != 1:
            raise PlanError(f"'{path}' is a version {version!r} plans file; this autopar reads "
                            "version 1 — re-run 'autopar search -o' to regenerate it")
        meta = {k: data[k] for k in ("objective", "optimal", "search_time_s") if k in data}
        context = {k: data[k] for k in CONTEXT_KEYS if k in data}
        if isinstance(data.get("validate"), dict):   # autopar validate output: chart in render
            meta["validate"] = data
    elif isinstance(data, dict) and "step_time_s" in data:
        items, context = [data], {}
    elif isinstance(data, list) and data and all(isinstance(x, dict) and "step_time_s" in x for x in data):
        items, context = data, {}
    else:
        what = ("an empty array" if data == [] else f"a JSON {type(data).__name__}" if not isinstance(data, dict)
                else "a JSON object with neither 'plans' nor 'step_time_s'")
        raise PlanError(f"'{path}' is not a plans file ({what}); {HINT}")
    if not items:
        raise PlanError(f"'{path}' holds no plans; re-run the search (it may have found none that fit)")
    records = []
    for i, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise PlanError(f"'{path}': plan {i} is a JSON {type(item).__name__}, not an object; {HINT}")
        d = dict(context)
        d.update(item)
        where = f"'{path}' plan {i}"
        missing = [k for k in CONTEXT_KEYS[:4] if d.get(k) is None]
        if missing:
            raise PlanError(f"{where} does not say its {', '.join(missing)}; write plans with "
                            "'autopar search -o' or 'autopar estimate --json', which record them")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise PlanError(f"{where} has no prediction(s) {missing}: it is a bare plan, not an "
                            f"estimate; score it with 'autopar estimate --json' first")
        try:
            plan = Plan.from_dict(d)   # ignores what estimate / validate write beside the plan
        except PlanError as e:
            raise PlanError(f"{where}: {e}") from None
        _check_numbers(d, where)
        rank = d.get("rank", i)
        records.append(PlanRecord(data=d, plan=plan, source=path,
                                  file_rank=int(rank) if isinstance(rank, int) else i, file_meta=meta))
    return records


def _check_numbers(d: dict, where: str) -> None:
    for k in ("step_time_s", "tokens_per_s"):
        v = d[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or v < 0:
            raise PlanError(f"{where}: '{k}'={v!r} must be a non-negative number")
    if not isinstance(d["memory_bytes"], dict) or "total" not in d["memory_bytes"]:
        raise PlanError(f"{where}: 'memory_bytes' must be an object with 'total' and its parts "
                        f"{list(MEMORY_KEYS)}")
    for k in ("breakdown_s", "comm_bytes"):
        if k in d and not isinstance(d[k], dict):
            raise PlanError(f"{where}: '{k}' must be an object")
    for k in ("breakdown_s", "memory_bytes"):        # explain and the charts do arithmetic on these
        for part, v in (d.get(k) or {}).items():
            if not _is_number(v):
                raise PlanError(f"{where}: '{k}.{part}'={v!r} must be a number")
    for k in ("mfu", "tflops_per_gpu", "hbm_bytes"):  # optional, but a number when given
        if d.get(k) is not None and not _is_number(d[k]):
            raise PlanError(f"{where}: '{k}'={d[k]!r} must be a number")
    for k in ("stages_detail", "comm"):
        if k in d and d[k] is not None and not isinstance(d[k], list):
            raise PlanError(f"{where}: '{k}' must be an array")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
