"""The Transformer Engine matmul scale on Blackwell, fitted on the BF16 half of the FP8 split's
calibration pairs only.

The only open runs of Megatron-core / NeMo on a Blackwell GPU that sit in a calibration split are
the FP8 split's (``costmodels.calibration.fp8_runs.CALIBRATION[("gb200-nvl72", "megatron")]``:
the paired NeMo Nemotron-4 340B weak-scaling rows on GB200 NVL72; the MoE split's one calibration
row is an H100 run). Each of those rows publishes its FP8 step and the speed-up over the BF16 run
of the same layout, so the BF16 step is ``published_step_s · published_speedup``. This module fits
ONE constant on those BF16 steps: the ``matmul_scale`` of (gb200-nvl72, transformer-engine), with
the least squared log step-time error on a 0.01 grid (as ``stack_fit.fit_stack`` does for H100),
the fused attention and element-wise figures of the entry held at their published values. The
FP8 ÷ BF16 speed-up of those rows stays what ``fp8_matmul_scale`` is fitted on; every other row
of either split is a check row and is never seen here.
"""
from __future__ import annotations

import math

from costmodels.calibration.fp8_runs import fp8_runs, predict
from costmodels.calibration.stack_fit import GRID, stack_override

HARDWARE, STACK, RUNTIME_STACK = "gb200-nvl72", "transformer-engine", "megatron"


def calibration_pairs(csv_path) -> list:
    """The FP8 split's calibration rows of (gb200-nvl72, megatron) that publish a BF16 pair."""
    runs, _ = fp8_runs(csv_path)
    return [r for r in runs if r.role == "calibration" and (r.hardware, r.stack) == (HARDWARE, RUNTIME_STACK)
            and r.published_step_s and r.published_speedup]


def bf16_loss(runs, table_of, profile_of) -> float:
    """Sum of squared log errors of the predicted BF16 step against ``step · speed-up``."""
    total = 0.0
    for r in runs:
        got = predict(r, table_of, profile_of())["bf16_s"]
        total += math.log(got / (r.published_step_s * r.published_speedup)) ** 2
    return total


def fit_blackwell_te(csv_path, table_of, profile_of, grid=GRID) -> dict:
    """{matmul_scale, loss, rows} of (gb200-nvl72, transformer-engine) on its calibration pairs;
    ``profile_of()`` loads the gb200 profile afresh (the stack is applied inside ``estimate``)."""
    runs = calibration_pairs(csv_path)
    if not runs:
        raise ValueError(f"no calibration pairs for {HARDWARE} / {RUNTIME_STACK} in {csv_path}")
    best = None
    for s in grid:
        with stack_override(HARDWARE, STACK, matmul_scale=round(float(s), 4)):
            err = bf16_loss(runs, table_of, profile_of)
        if best is None or err < best[0]:
            best = (err, round(float(s), 4))
    return {"hardware": HARDWARE, "stack": STACK, "matmul_scale": best[1], "loss": best[0], "rows": len(runs),
            "row_ids": [r.row_id for r in runs]}
