"""Ranking within a sweep, and when a sweep is too flat to rank.

docs/validation.md scores how well the cost model orders the runs of one sweep (Spearman's rank
correlation of published against predicted tokens/s per GPU, and MFU). A rank correlation only
says something when the published figures differ by more than their measurement noise: a
weak-scaling sweep (the same per-GPU work at every size, e.g. NeMo's GPT-3 175B on 128 – 2048
H100, dp 4 – 64) publishes five figures within 2 % that are not monotone in the GPU count, and
any model of the same per-GPU work ranks them arbitrarily.

The rule, applied to every sweep and every ranked column alike:

* **noise** ``σ``: the run-to-run spread of one published configuration, estimated from the open
  data itself — every configuration (model, GPU, GPUs, tp, pp, cp, vpp, micro-batch, global batch,
  sequence, precision) published twice by one framework generation (the ``framework`` column's
  first two words, e.g. "NeMo 1": a release of the same software, not a rewrite) in
  ``fp8_runs.csv``. For each such pair ``d = |t1/t2 − 1|``; the difference of two draws of
  relative spread ``σ`` has median ``0.6745·√2·σ``, so ``σ = median(d) / 0.954``.
* **flat**: a sweep of ``n`` runs whose published spread ``max/min − 1`` is at most
  ``d_n·σ``, the expected range of ``n`` identical runs measured with that noise (``d_n`` =
  E[range of n standard normal draws]: 2.33 for 5, 2.97 for 9): nothing in the published figures
  tells its runs apart from one run measured ``n`` times, so there is no order to rank.
* a flat sweep is not given a Spearman; it is scored instead on whether the model also predicts
  it flat (predicted spread within the same ``d_n·σ``): a model that invented a spread the
  runs do not show would fail it. Every other sweep keeps its Spearman, ties averaged.

The noise estimate and each sweep's spread are printed beside the table, so a reader can redo
the call.
"""
from __future__ import annotations

import math
import statistics
from functools import lru_cache
from pathlib import Path

from costmodels.calibration.open_runs import spearman
from costmodels.calibration.validation import read_csv

REPEAT_FILE = "fp8_runs.csv"
REPEAT_KEY = ("model", "gpu", "gpus", "tp", "pp", "cp", "vpp", "micro_batch", "global_batch", "seq", "precision")


@lru_cache(maxsize=4)
def repeat_pairs(directory: Path | None = None) -> tuple[float, ...]:
    """``|t1/t2 − 1|`` of every configuration published twice by one framework generation
    (module docstring), from ``fp8_runs.csv``."""
    seen: dict[tuple, list[float]] = {}
    for r in read_csv(REPEAT_FILE, directory):
        if not r.get("step_time_s"):
            continue
        gen = " ".join(r.get("framework", "").split()[:2])
        key = tuple(r.get(k, "").strip() for k in REPEAT_KEY) + (gen,)
        seen.setdefault(key, []).append(float(r["step_time_s"]))
    return tuple(abs(t[0] / t[1] - 1.0) for t in seen.values() if len(t) == 2)


def noise_sigma(directory: Path | None = None) -> float:
    """σ, the relative run-to-run spread of one configuration (module docstring)."""
    d = repeat_pairs(directory)
    return statistics.median(d) / (0.6745 * math.sqrt(2.0)) if d else 0.0


@lru_cache(maxsize=64)
def expected_range(n: int) -> float:
    """E[max − min] of ``n`` independent standard normal draws (``d_n`` of quality control),
    by integrating ``1 − Φ(x)^n − (1 − Φ(x))^n`` over x."""
    if n < 2:
        return 0.0
    step, total = 0.001, 0.0
    for i in range(-8000, 8000):
        phi = 0.5 * (1.0 + math.erf((i + 0.5) * step / math.sqrt(2.0)))
        total += (1.0 - phi ** n - (1.0 - phi) ** n) * step
    return total


def spread(values) -> float:
    return max(values) / min(values) - 1.0


def rank_sweep(published, predicted, sigma: float) -> dict:
    """How a sweep's ranking is scored (module docstring): {"flat": bool, "spearman": r or None,
    "published_spread", "predicted_spread", "limit", "predicted_flat": bool or None}."""
    n = len(published)
    limit = expected_range(n) * sigma
    pub, pred = spread(published), spread(predicted)
    flat = pub <= limit
    return {"flat": flat, "spearman": None if flat else spearman(list(published), list(predicted)),
            "published_spread": pub, "predicted_spread": pred, "limit": limit,
            "predicted_flat": (pred <= limit) if flat else None}
