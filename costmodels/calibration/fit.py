"""The per-GPU calibration on open data: the fewest constants, fitted on a documented split.

Per GPU type three constants are fitted, on that GPU's calibration rows only
(``costmodels.calibration.open_runs.CALIBRATION``: every run of mpt-1b under FSDP on that GPU):

* ``scale`` of the matmul-efficiency curve: the GPU's curve is ``SHAPE × scale`` at
  ``SHAPE_FLOPS`` (log-linear between, clamped), the shape set a priori
  (``costmodels.calibration.validation.SHAPE``: small matmuls poor, saturating towards large ones);
* ``attention``: the fused (flash) attention core's efficiency, the fraction of peak its forward
  reaches at the FLOPs the model counts for it (``4·b·s²·h``, causal masking not discounted, as
  the published MFU formulas count them; the backward takes ``compute.FLASH_BWD_RATIO`` = 2.5
  times as long, the kernel recomputing the scores): the profile's ``attention_efficiency``;
* ``slowdown``: the step time lost per second of dp / ZeRO collective run hidden beside compute
  (NCCL's kernels share the SMs and HBM; the figure also absorbs what the profile's link
  bandwidths miss at FSDP's per-layer messages): the profile's ``collective_slowdown``. Only
  rows with real ZeRO traffic identify it: on H100 the data-parallel sweep of mpt-1b (16 to 512
  GPUs, 3 to 27 % of the step); the A100 calibration rows (8 GPUs, under 4 %) cannot, so the A100
  takes the H100's figure (``SLOWDOWN_FROM``; the same mechanism; its check rows judge it).

The fit minimises the sum of squared log errors of the step time, on a coarse grid then a fine
one around its best point. Nothing else is fitted here: the element-wise traffic of Megatron's
kernels (``megatron`` runtime, ``C_FWD``) keeps its fit on Korthikanti's Table 5
(``costmodels.calibration.validation.fit``), and the runtime profiles' overlap figures are taken from the
runtimes' documentation, not from data. The H200 inherits the H100's constants (the same
Hopper SMs and clocks; only HBM size and bandwidth differ, and those come from its datasheet);
the B200 has no open run to fit on and keeps an assumed curve (its profile says so).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from costmodels.calibration.open_runs import CALIBRATION, OpenRun, open_runs, predict
from costmodels.calibration.validation import SHAPE, SHAPE_FLOPS
from costmodels.profiles.hardware import HardwareProfile
from costmodels.profiles.hardware_files import load_profile

A100_PEAK = 312e12   # the peak SHAPE_FLOPS are set for (bf16 dense, A100)
# GPUs whose calibration rows cannot identify the collective slowdown take it from another's fit
SLOWDOWN_FROM = {"a100-80g-sxm": "h100-80g-sxm"}


def shape_flops(base: HardwareProfile) -> tuple[float, ...]:
    """The curve's sizes for ``base``: SHAPE_FLOPS scaled by its peak over the A100's, so that a
    matmul reaches a point of the shape after the same time at peak on every GPU (a faster GPU
    needs a larger matmul to hide the same launch and wave-quantisation overheads)."""
    r = base.peak_flops_per_s(2) / A100_PEAK
    return tuple(float(f"{f * r:.4g}") for f in SHAPE_FLOPS)


def calibrated(base: HardwareProfile, scale: float, attention: float,
               slowdown: float | None = None) -> HardwareProfile:
    """``base`` with the efficiency curve ``SHAPE × scale``, the attention efficiency and (when
    given) the collective slowdown."""
    curve = tuple(round(min(1.0, e * scale), 4) for e in SHAPE)
    prof = dataclasses.replace(base, eff_flops=shape_flops(base), eff_values=curve,
                               attention_efficiency=round(attention, 4))
    if slowdown is not None:
        prof = dataclasses.replace(prof, collective_slowdown=round(slowdown, 4))
    return prof


def loss(runs: list[OpenRun], prof: HardwareProfile, table_of) -> float:
    """Σ log(predicted / published)² over ``runs``."""
    return float(sum(math.log(predict(r, table_of, prof)["predicted_step_s"] / r.published_step_s) ** 2
                     for r in runs))


def fit_gpu(hardware: str, table_of: Callable, runs: list[OpenRun] | None = None,
            slowdown: float | None = None) -> dict:
    """Fit (scale, attention, slowdown) for ``hardware`` on its calibration rows, or (scale,
    attention) with ``slowdown`` given (a GPU whose calibration rows cannot identify it:
    ``SLOWDOWN_FROM``); returns the constants, the curve and the loss. A coarse grid, then a
    fine one around its best point."""
    base = load_profile(hardware)
    runs = [r for r in (runs or open_runs()) if r.hardware == hardware and r.role == "calibration"]
    if not runs:
        raise ValueError(f"no calibration rows for {hardware}")
    fixed = slowdown is not None
    coarse_s = [slowdown] if fixed else np.round(np.arange(0.0, 1.001, 0.1), 4)
    best = _grid(runs, base, table_of, np.arange(0.60, 1.41, 0.05), np.arange(0.20, 1.01, 0.05), coarse_s)
    s0, a0, k0 = best[1], best[2], best[3]
    fine_s = np.round(np.arange(s0 - 0.05, s0 + 0.0501, 0.01), 4)
    fine_a = np.round(np.arange(max(0.05, a0 - 0.05), min(1.0, a0 + 0.05) + 1e-9, 0.01), 4)
    # the fine grids span one coarse step either side (the slowdown's coarse step is 0.1)
    fine_k = [slowdown] if fixed else np.round(np.arange(max(0.0, k0 - 0.1), min(1.0, k0 + 0.1) + 1e-9, 0.01), 4)
    best = _grid(runs, base, table_of, fine_s, fine_a, fine_k)
    prof = calibrated(base, best[1], best[2], best[3])
    return {"hardware": hardware, "scale": float(best[1]), "attention": float(best[2]),
            "slowdown": float(best[3]), "slowdown_fitted": not fixed, "curve": prof.eff_values,
            "loss": best[0], "rows": len(runs)}


def fit_all(table_of: Callable) -> dict[str, dict]:
    """Every GPU's fit, the GPUs that fit the slowdown first (``SLOWDOWN_FROM``)."""
    out: dict[str, dict] = {}
    for hw in sorted(CALIBRATION, key=lambda h: h in SLOWDOWN_FROM):
        donor = SLOWDOWN_FROM.get(hw)
        out[hw] = fit_gpu(hw, table_of, slowdown=out[donor]["slowdown"] if donor else None)
    return out


def _grid(runs, base, table_of, scales, attentions, slowdowns):
    best = None
    for s in scales:
        for a in attentions:
            if a <= 0 or a > 1:
                continue
            for k in slowdowns:
                err = loss(runs, calibrated(base, float(s), float(a), float(k)), table_of)
                if best is None or err < best[0]:
                    best = (err, float(s), float(a), float(k))
    return best
