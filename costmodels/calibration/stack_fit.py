"""The per-(GPU, kernel stack) fit: the fewest constants, on open runs of that stack only.

For (h100-80g-sxm, transformer-engine) ONE constant is fitted, the matmul curve's
``matmul_scale``, on the calibration rows of ``costmodels.calibration.dgxc_runs`` (the
Nemotron-4 15B weak-scaling sweep, 8 runs: the same per-GPU work at 16 to 2048 GPUs, which
cannot tell a matmul constant from an attention one apart). The stack's other figures are not
fitted: the fused attention's forward efficiency and backward ratio are read off a published
kernel benchmark, the element-wise traffic is the byte count of fused kernels
(``kernel_stacks.toml`` cites each). The fit minimises the sum of squared log errors of the step
time on a grid of 0.01; the check rows (GPT-3 175B, Nemotron-4 340B) are never seen.

``python benchmarks/bench_costmodels_validation.py --calibrate`` runs it (with the per-GPU fits
of ``costmodels.calibration.fit``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

from costmodels.calibration.deepspeed_runs import deepspeed_runs
from costmodels.calibration.dgxc_runs import dgxc_runs
from costmodels.calibration.open_runs import OpenRun, predict
from costmodels.profiles import kernel_stacks

STACK_CALIBRATION = {("h100-80g-sxm", "transformer-engine"): dgxc_runs,   # (GPU, stack) -> its open runs
                     # Megatron-DeepSpeed: BLOOM 176B the calibration row, MT-NLG 530B the checks
                     ("a100-80g-sxm", "megatron-deepspeed"): deepspeed_runs}


@contextmanager
def stack_override(hardware: str, stack: str, **figures: float):
    """Predict with (``hardware``, ``stack``)'s figures replaced (a fit's trial point)."""
    import costmodels.model.coefficients as co
    saved = kernel_stacks.load_stacks()
    trial = dict(saved)
    entry = dict(trial.get((hardware, stack), {}))
    entry.update({k: (float(v), "trial") for k, v in figures.items()})
    trial[(hardware, stack)] = entry
    kernel_stacks.load_stacks.cache_clear()
    original = kernel_stacks.load_stacks
    kernel_stacks.load_stacks = lambda path=None: trial
    kernel_stacks.stack_profile.cache_clear()
    co._CACHE.clear()
    try:
        yield
    finally:
        kernel_stacks.load_stacks = original
        kernel_stacks.stack_profile.cache_clear()
        co._CACHE.clear()


def loss(runs: list[OpenRun], table_of) -> float:
    return float(sum(math.log(predict(r, table_of)["predicted_step_s"] / r.published_step_s) ** 2
                     for r in runs))


GRID = tuple(np.round(np.arange(0.50, 1.301, 0.01), 2))   # matmul_scale candidates


def fit_stack(hardware: str, stack: str, table_of: Callable, grid=GRID) -> dict:
    """The ``matmul_scale`` of (``hardware``, ``stack``) with the least squared log error on its
    calibration rows (module docstring)."""
    runs = [r for r in STACK_CALIBRATION[(hardware, stack)]() if r.role == "calibration"
            and r.hardware == hardware]
    if not runs:
        raise ValueError(f"no calibration rows for {hardware} / {stack}")
    best = None
    for s in grid:
        with stack_override(hardware, stack, matmul_scale=round(float(s), 4)):
            err = loss(runs, table_of)
        if best is None or err < best[0]:
            best = (err, round(float(s), 4))
    return {"hardware": hardware, "stack": stack, "matmul_scale": best[1], "loss": best[0], "rows": len(runs)}
