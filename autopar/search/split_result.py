"""What one split program's solve returns (``SplitModel.solve``): status, the split, its
objective, the proved bound and why it stopped — read by the frontier, the pools' search and the
infeasibility explanation, which need it without the CP-SAT model that made it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SplitResult:
    status: str                    # "optimal" | "feasible" | "infeasible" | "unknown"
    stages: tuple[tuple[int, int], ...] | None
    objective_s: float | None      # step time (or bytes, objective="memory") from the integer model
    wall_s: float
    bound_s: float | None = None   # proved lower bound on this configuration's step time (all splits)
    # the objective was a lower bound on the estimate, exact only where it equals it (the fast
    # program of autopar.search.split_schedules); slack_s: the rounding it may differ by
    bound_only: bool = False
    slack_s: float = 0.0
    # stopped because the proved bound passed ``SplitModel.stop_above_s`` (not out of time): the
    # configuration cannot be next, so its proof waits until its bound is the smallest again
    stopped: bool = False
    det_s: float = 0.0             # CP-SAT's deterministic time (load-independent work measure)
