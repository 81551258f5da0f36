"""What ``estimate`` returns: one plan's step time, throughput, memory and breakdown, and its
JSON form (the plan's fields beside the figures, as plans files store it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from costmodels.contracts.plan import Plan


@dataclass
class Estimate:
    plan: Plan
    model: str
    hardware: str
    gpus: int
    global_batch: int
    seq: int
    num_micro_batches: int
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    memory_bytes: dict[str, float]
    hbm_bytes: float
    fits: bool
    comm_bytes: dict[str, float]
    breakdown_s: dict[str, float]
    stages_detail: list[dict[str, Any]] = field(default_factory=list)
    comm: list[dict[str, Any]] = field(default_factory=list)
    stages: tuple[tuple[int, int], ...] = ()
    error_band: dict[str, Any] | None = None   # costmodels.profiles.error_bands: the step time's likely error
    cluster: dict[str, Any] | None = None      # pooled plans: GPUs used / idle per pool, the links

    def to_dict(self) -> dict[str, Any]:
        d = self.plan.to_dict()
        d.update({"model": self.model, "hardware": self.hardware, "gpus": self.gpus,
                  "global_batch": self.global_batch, "seq": self.seq,
                  "num_micro_batches": self.num_micro_batches, "step_time_s": self.step_time_s,
                  "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu,
                  "mfu": self.mfu, "bubble_fraction": self.bubble_fraction,
                  "memory_bytes": dict(self.memory_bytes), "hbm_bytes": self.hbm_bytes,
                  "fits": self.fits, "comm_bytes": dict(self.comm_bytes),
                  "breakdown_s": dict(self.breakdown_s), "stages_detail": self.stages_detail,
                  "comm": self.comm, "error_band": self.error_band})
        if self.cluster is not None:
            d["cluster"] = self.cluster
        return d
