"""The report's inputs: plans files (``autopar search -o``, ``autopar validate -o``) and estimate
JSON (``autopar estimate --json``), read by ``costmodels.contracts.plans_file.PlansFile``.

``PlansFile.read`` accepts the shapes (a plans file, one estimate result, an array of them) and
``check_estimates`` rejects a plan the report cannot draw (no context, a missing or non-numeric
prediction), each with one ``PlanError`` line naming the file, the plan and the fix. Here each
plan becomes a ``PlanRecord``: the report's view of it, with the file's context filled in, the
file it came from and its row number in the ranked table. Plans of different models mixed
without ``allow_mixed`` are refused here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from costmodels.contracts.breakdown import MEMORY_KEYS as ESTIMATE_MEMORY_KEYS
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import CONTEXT_KEYS, HINT, PlansFile
from costmodels.model.estimate import BREAKDOWN_KEYS  # noqa: F401  (re-exported: analysis, charts, render)

# the memory parts the report stacks; 'total' is their sum and is shown on its own
MEMORY_KEYS = tuple(k for k in ESTIMATE_MEMORY_KEYS if k != "total")
COMM_KINDS = ("dp", "tp", "pp", "zero", "cp")


@dataclass
class PlanRecord:
    data: dict[str, Any]          # the estimate result (plan fields, predictions, file context)
    plan: Plan                    # the validated plan fields
    source: str                   # the file it came from
    file_rank: int                # its rank inside that file (1 = the file's best)
    file_meta: dict[str, Any] = field(default_factory=dict)  # objective, optimal, search_time_s;
                                  # "validate": the whole file, when autopar validate wrote it
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
        records.extend(records_of(path))
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


def records_of(source: Any, label: str | None = None) -> list[PlanRecord]:
    """The plans of one input (a path, or a plans-file dict such as ``SearchResult.plans_file()``
    named ``label``), checked as estimates."""
    pf = PlansFile.read(source, label=label).check_estimates()
    meta = {k: getattr(pf, k) for k in ("objective", "optimal", "search_time_s")
            if getattr(pf, k) is not None}
    comparison = (pf.extra or {}).get("comparison")
    if isinstance(comparison, dict) and comparison.get("text"):   # search --compare-with-current
        meta["comparison"] = comparison["text"]
    if pf.validate is not None:          # autopar validate output: render adds its chart
        meta["validate"] = pf.to_dict()
    filled = pf.to_dict(filled=True)["plans"]
    return [PlanRecord(data=d, plan=r.plan, source=pf.source, file_rank=r.rank, file_meta=meta)
            for r, d in zip(pf.results, filled)]
