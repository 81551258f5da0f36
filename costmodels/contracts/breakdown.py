"""The step-time breakdown's vocabulary: its terms, their labels, and what a plan's bottleneck is.

``autopar explain`` (and ``autopar search --explain``) and ``autopar report`` both tell a user
what limits a plan. They read the definition and the words from here, so for the same plan they
name the same bottleneck in the same terms. This module sits in ``costmodels`` (torch-free, the
ground floor) because search and report both stand on the cost model: neither has to import the
other for its words, so no package loop.

**Bottleneck**: the largest term of the estimate's ``breakdown_s``. The terms are the step time
as the slowest pipeline rank spends it — compute, recomputation, pipeline bubble, and the exposed
(not overlapped) part of data-parallel, tensor-parallel, pipeline and ZeRO-3 communication — and
they sum to the step time (``costmodels.model.estimate``). So the largest term is where most of the
step goes, where the same relative saving shortens the step most: what a user should look at
first. Compute counts like any other term (a plan whose largest term is compute is
compute-bound), and there is no threshold: the report used to call compute the bottleneck only
above 75% of the step and otherwise name the largest overhead, so it could disagree with
``explain`` on the same plan.

When the plan is pipelined (more than one entry in ``stages_detail``) and the term is one that
rank spends itself (compute, recomputation, exposed TP / PP / ZeRO-3 communication), the
bottleneck also names that stage: the slowest pipeline rank, whose per-micro-batch time sets the
pipeline's pace and whose terms the breakdown holds. The bubble (the pipeline's fill and drain)
and the exposed data-parallel sync (the worst over ranks) belong to no single stage.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# the keys of an estimate's memory_bytes (the most loaded GPU; total = the sum of the others).
# "params" / "grads" / "optimizer" are the model states (ZeRO's Table 1); "gathered" the weights
# ZeRO-3 gathers whole to compute with (the working copies of the rows being run and prefetched)
MEMORY_KEYS = ("params", "grads", "optimizer", "gathered", "activations", "reserve", "total")
BREAKDOWN_KEYS = ("compute", "recompute", "bubble", "dp_exposed", "tp_exposed", "pp_exposed",
                  "zero_exposed")
TERM_LABELS = {"compute": "compute", "recompute": "recomputation", "bubble": "pipeline bubble",
               "dp_exposed": "exposed DP gradient sync", "tp_exposed": "exposed TP communication",
               "pp_exposed": "exposed PP send/recv", "zero_exposed": "exposed ZeRO-3 gathers"}
# ``comm_bytes`` / ``comm`` kinds: what each kind of communication moves
COMM_KIND_LABELS = {"dp": "DP gradients", "tp": "TP activations", "pp": "PP sends", "zero": "ZeRO-3 gathers",
                    "cp": "CP K/V exchange"}   # cp: only plans with context parallelism
# terms the slowest pipeline rank spends itself (the breakdown is that rank's)
STAGE_TERMS = frozenset({"compute", "recompute", "tp_exposed", "pp_exposed", "zero_exposed"})


def term_label(term: str) -> str:
    """The words for a breakdown term; an unknown key is shown as it is."""
    return TERM_LABELS.get(term, term)


@dataclass(frozen=True)
class Bottleneck:
    term: str                 # a BREAKDOWN_KEYS key
    seconds: float            # that term's seconds per step
    share: float | None       # seconds / step time (None when the step time is 0)
    stage: int | None         # the slowest pipeline rank, when the term is spent there (see above)

    @property
    def label(self) -> str:
        return term_label(self.term)

    def where(self) -> str:
        """`` on pipeline stage N`` when the bottleneck has a stage, else empty."""
        return f" on pipeline stage {self.stage}" if self.stage is not None else ""


def bottleneck(estimate: Mapping[str, Any]) -> Bottleneck | None:
    """The bottleneck of one estimate result (``Estimate.to_dict()`` or a plans-file entry), as
    defined in the module docstring; None when it has no ``breakdown_s`` to judge by. Ties go to
    the earlier term of ``BREAKDOWN_KEYS``."""
    raw = estimate.get("breakdown_s") or {}
    terms = {k: float(raw[k] or 0.0) for k in BREAKDOWN_KEYS if k in raw}
    if not terms:
        return None
    term = max(terms, key=terms.get)
    step = float(estimate.get("step_time_s") or 0.0)
    stage = slowest_stage(estimate) if term in STAGE_TERMS else None
    return Bottleneck(term, terms[term], terms[term] / step if step > 0 else None, stage)


def slowest_stage(estimate: Mapping[str, Any]) -> int | None:
    """The pipeline rank with the most time per micro-batch (forward + backward over its virtual
    chunks, ``stages_detail``); the first of near-equal ones (the estimate's own pick among equal
    ranks). None without a pipeline (fewer than two stages in ``stages_detail``)."""
    detail = estimate.get("stages_detail") or []
    if len(detail) < 2:
        return None
    totals = [(_total(s.get("fwd_s")) + _total(s.get("bwd_s")), s.get("stage", i))
              for i, s in enumerate(detail)]
    top = max(t for t, _ in totals)
    return next(int(stage) for t, stage in totals if t >= top * (1 - 1e-9))


def _total(seconds) -> float:
    """``fwd_s`` / ``bwd_s`` of a stage: a list with one entry per virtual chunk, or a number."""
    if isinstance(seconds, (list, tuple)):
        return float(sum(float(x or 0.0) for x in seconds))
    return float(seconds or 0.0)
