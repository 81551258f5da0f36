"""Published orders that the runs' own configurations contradict.

docs/validation.md ranks the runs of one sweep by Spearman's rank correlation
(``costmodels.calibration.sweep_ranking``). Some pairs of runs have an order that their
configurations fix before anything is measured or modelled:

* run ``long`` **does at least run** ``short``'**s work** when both are one model on the same
  GPUs and GPU count, with the same plan except the micro-batch size (sharding, recompute,
  runtime), the same tokens per micro-batch (``micro_batch · seq``) and the same tokens per
  step (``global_batch · seq``), and ``long`` has the longer sequence. The two then run the
  same matmuls on the same number of tokens, the same number of micro-batches, layers and
  kernels, the same collectives, optimizer step and per-step host work; ``long`` adds attention
  (its FLOPs per token grow with the sequence) and a larger learned position table, nothing
  else. A per-kernel, per-layer or per-step fixed time is the same in both, so no such
  mechanism can make ``short`` slower. Every model that prices the configuration predicts
  ``short`` at least as fast; ``tests/test_costmodels_sweep_consistency.py`` checks that
  autopar's does.
* a **reversal** is such a pair published the other way round: ``long``'s tokens/s per GPU
  above ``short``'s by ``r = tok_long / tok_short − 1 > 0``. Its size in noise units is
  ``z = r / (√2·σ)``, σ the run-to-run spread of one configuration
  (``sweep_ranking.noise_sigma``; the difference of two runs has spread ``√2·σ``).

A reversal says the published pair differs in something the table does not record (a node, a
software image, a warm-up window), not in the configuration: the cost model can only rank such
runs wrongly, whatever its constants.

**What a model exactly right would score** (``perfect_model_spearman``): a column's published
figures carry run-to-run noise σ, so even a model that predicts every run's true figure does not
reach Spearman 1 on a column whose runs differ by a few σ. Taking the published figures as the
truth, each is drawn again ``DRAWS`` times with noise σ (log-normal, a fixed seed) and ranked
against itself: the median Spearman and the share of draws at or above ``TARGET`` say how much
rank the column can show at all. (The published figures already hold one draw of noise, so
their spread overstates the truth's and this is an upper estimate.)

docs/validation.md reports, per ranked column, the Spearman over all runs (the figure the issue
scores, computed as before by ``sweep_ranking.rank_sweep``), the perfect model's median and share,
the reversals of ``z ≥ REPORT_Z`` and the Spearman without their shorter runs, so a reader
sees each beside the other. Nothing here is fitted or used by the cost model.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict

from costmodels.calibration.open_runs import spearman

REPORT_Z = 2.0   # reversals listed (a one-sided 2.3 % tail for a pair of identical runs)
TARGET = 0.8     # the within-sweep Spearman issue 31 asks for
DRAWS = 2000


def _key(run) -> tuple:
    """What two runs must share for one to do at least the other's work (module docstring)."""
    plans = tuple(p.with_(micro_batch_size=1) for p in run.plans)
    return (run.source, run.hardware, run.model, run.gpus, plans)


def does_at_least_the_work_of(long, short) -> bool:
    """Whether run ``long`` does at least run ``short``'s work (module docstring)."""
    if _key(long) != _key(short) or long.seq <= short.seq:
        return False
    mb_long, mb_short = long.plans[0].micro_batch_size, short.plans[0].micro_batch_size
    return (mb_long * long.seq == mb_short * short.seq
            and long.global_batch * long.seq == short.global_batch * short.seq)


def dominated_pairs(runs) -> list[tuple]:
    """Every (short, long) pair of ``runs`` in which ``long`` does at least ``short``'s work."""
    groups = defaultdict(list)
    for r in runs:
        groups[_key(r)].append(r)
    return [(a, b) for rs in groups.values() for a in rs for b in rs if does_at_least_the_work_of(b, a)]


def reversals(runs, sigma: float, min_z: float = REPORT_Z) -> list[dict]:
    """The dominated pairs published the other way round by ``z ≥ min_z`` noise units:
    [{"short", "long", "reversal" (relative), "z"}], largest z first."""
    out = []
    for short, long in dominated_pairs(runs):
        r = long.published_tokens_per_s_per_gpu / short.published_tokens_per_s_per_gpu - 1.0
        z = r / (math.sqrt(2.0) * sigma) if sigma > 0 else math.inf
        if r > 0 and z >= min_z:
            out.append({"short": short, "long": long, "reversal": r, "z": z})
    return sorted(out, key=lambda x: -x["z"])


def contradicted_runs(runs, sigma: float, min_z: float = REPORT_Z) -> set[str]:
    """Labels of the shorter runs of every reversal of ``z ≥ min_z``."""
    return {x["short"].label for x in reversals(runs, sigma, min_z)}


def perfect_model_spearman(published, sigma: float, draws: int = DRAWS, seed: int = 0) -> dict:
    """Spearman of the published figures against themselves drawn again with noise σ
    (module docstring): {"median", "share_at_target"}."""
    rng = random.Random(seed)
    rs = [spearman(list(published), [v * math.exp(rng.gauss(0.0, sigma)) for v in published])
          for _ in range(draws)]
    return {"median": statistics.median(rs), "share_at_target": sum(r >= TARGET for r in rs) / draws}


def report_lines(sweeps: dict, sigma: float) -> list[str]:
    """docs/validation.md's section on what each sweep's ranking can show. ``sweeps``: sweep name
    -> the benchmark's result dicts of its check rows (``run``, ``predicted_tokens_per_s_per_gpu``,
    ``predicted_mfu``)."""
    from costmodels.calibration.sweep_ranking import rank_sweep
    L = ["### Open runs: what each ranking can show (costmodels/calibration/sweep_consistency.py)\n",
         "For every ranked (not flat) column above: its Spearman over all runs; what a model exactly "
         f"right would score against the same figures at the run-to-run noise σ = {100 * sigma:.1f} % "
         f"(median of {DRAWS} redraws of the published figures, and the share of redraws at or above "
         f"{TARGET}); the published **reversals** — a run published slower, by z ≥ {REPORT_Z:g} noise "
         "units of a pair, than a run of the same sweep that does at least its work (the same GPUs, "
         "plan, tokens per micro-batch and per step, and a longer sequence: only more attention), "
         "which no model of the configuration can rank; and the Spearman without those slower runs.\n",
         "| sweep | column | Spearman | a model exactly right: median (share ≥ 0.8) | reversals (z) "
         "| Spearman without their slower runs |",
         "| --- | --- | ---: | ---: | --- | ---: |"]
    for name, xs in sweeps.items():
        rev = reversals([x["run"] for x in xs], sigma)
        slow = {x["short"].label for x in rev}
        rev_txt = "; ".join(f"seq {x['short'].seq} below seq {x['long'].seq} by {100 * x['reversal']:.1f} % "
                            f"(z = {x['z']:.1f})" for x in rev) or "none"
        cols = (("tokens/s/GPU", lambda x: x["run"].published_tokens_per_s_per_gpu,
                 lambda x: x["predicted_tokens_per_s_per_gpu"]),
                ("MFU", lambda x: x["run"].published_mfu, lambda x: x["predicted_mfu"]))
        for col, pub, pred in cols:
            ys = [x for x in xs if pub(x)]
            if len(ys) < 5:
                continue
            r = rank_sweep([pub(x) for x in ys], [pred(x) for x in ys], sigma)
            if r["flat"]:
                continue
            p = perfect_model_spearman([pub(x) for x in ys], sigma)
            kept = [x for x in ys if x["run"].label not in slow]
            without = (f"{spearman([pub(x) for x in kept], [pred(x) for x in kept]):+.2f}"
                       if slow and len(kept) >= 5 else "—")
            L.append(f"| {name} | {col} | {r['spearman']:+.2f} | {p['median']:+.2f} "
                     f"({100 * p['share_at_target']:.0f} %) | {rev_txt} | {without} |")
    return L
