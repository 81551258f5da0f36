"""Why the best plan wins: its bottleneck, and what each runner-up loses on.

Works on a plans file (``autopar search -o``) or anything holding estimate results. Pure data in,
data out (``explain_plans``) plus a text rendering (``render_explanation``).

* The best plan's bottleneck as ``costmodels.contracts.breakdown.bottleneck`` defines it (the definition the
  report uses too): the largest term of its step-time breakdown (``breakdown_s``: compute,
  recompute, bubble, exposed dp / tp / pp / ZeRO communication), with its share of the step and,
  for a pipelined plan, the stage; plus its memory headroom on the most loaded GPU and which
  memory term dominates.
* Each runner-up: how much slower (or, for per-GPU throughput, less efficient) it is, which
  breakdown terms grew the most against the best (the ones that explain the gap), and which plan
  fields differ.
"""
from __future__ import annotations

from typing import Any

from autopar.search.schedule_gain import gain_text
from costmodels.contracts.breakdown import bottleneck as find_bottleneck
from costmodels.contracts.breakdown import term_label
from costmodels.contracts.plan import AXIS_DEFAULTS, PLAN_FIELDS, Plan
from costmodels.contracts.plans_file import PlanResult

# the fields compared between plans: all but the split points (every searched plan has its own)
COMPARED_FIELDS = tuple(k for k in PLAN_FIELDS if k != "stages")
GiB = 1024 ** 3


def _fields(p: dict) -> dict:
    d = PlanResult.from_dict(p).plan.to_dict()
    return {k: d[k] for k in COMPARED_FIELDS if k in d}   # a uniform plan has no pools keys


def explain_plans(data: dict[str, Any]) -> dict[str, Any]:
    plans = data["plans"]
    best = plans[0]
    bd = {k: float(v) for k, v in (best.get("breakdown_s") or {}).items()}
    step = float(best["step_time_s"])
    bn = find_bottleneck(best)
    mem = best.get("memory_bytes") or {}
    mem_terms = {k: float(mem[k]) for k in ("params", "grads", "optimizer", "activations") if k in mem}
    out = {
        "best": {
            "rank": best.get("rank", 1), "fields": _fields(best), "step_time_s": step,
            "bottleneck": bn.term if bn else None, "bottleneck_s": bn.seconds if bn else None,
            "bottleneck_share": bn.share if bn else None, "bottleneck_stage": bn.stage if bn else None,
            "breakdown_s": bd,
            "memory_total_bytes": mem.get("total"), "hbm_bytes": best.get("hbm_bytes"),
            "memory_dominant": max(mem_terms, key=mem_terms.get) if mem_terms else None,
            "mfu": best.get("mfu"),
        },
        "runners_up": [],
        "objective": data.get("objective", "step_time"),
        "optimal": data.get("optimal"),
    }
    why = (best.get("cluster") or {}).get("why")
    if why:   # a pooled plan (heterogeneous cluster): why each pool got its share of the split
        out["best"]["pools_why"] = list(why)
    if gain_text(best):   # what a zero-bubble schedule bought (search.schedule_gain)
        out["best"]["schedule_gain"] = gain_text(best)
    if data.get("precision_gain"):   # what FP8 bought over the best BF16 plan (search.precision_gain)
        out["best"]["precision_gain"] = data["precision_gain"]["text"]
    bf = _fields(best)
    for p in plans[1:]:
        pbd = {k: float(v) for k, v in (p.get("breakdown_s") or {}).items()}
        eps = 1e-6 * max(step, 1e-12)   # float noise is not a loss
        deltas = {k: pbd.get(k, 0.0) - bd.get(k, 0.0) for k in set(pbd) | set(bd)}
        deltas = {k: d for k, d in deltas.items() if abs(d) > eps}
        losses = sorted(((k, d) for k, d in deltas.items() if d > 0), key=lambda kv: -kv[1])
        gains = sorted(((k, d) for k, d in deltas.items() if d < 0), key=lambda kv: kv[1])
        pf = _fields(p)
        gap = float(p["step_time_s"]) - step
        entry = {"rank": p.get("rank"), "fields": pf, "step_time_s": float(p["step_time_s"]),
                 "gap_s": gap, "gap_fraction": gap / step if step > 0 else None,
                 "loses_on": [{"term": k, "extra_s": d} for k, d in losses[:3]],
                 "gains_on": [{"term": k, "saved_s": -d} for k, d in gains[:2]],
                 "differs_in": {k: [bf.get(k, AXIS_DEFAULTS.get(k)), pf.get(k, AXIS_DEFAULTS.get(k))]
                                for k in COMPARED_FIELDS   # cp, dp_shard, ...: left out at default
                                if bf.get(k, AXIS_DEFAULTS.get(k)) != pf.get(k, AXIS_DEFAULTS.get(k))}}
        if gain_text(p):
            entry["schedule_gain"] = gain_text(p)
        if data.get("objective") == "throughput_per_gpu" and best.get("tflops_per_gpu") and p.get("tflops_per_gpu"):
            entry["tflops_per_gpu_gap"] = float(best["tflops_per_gpu"]) - float(p["tflops_per_gpu"])
        if data.get("objective") in ("throughput_per_gpu", "fewest_gpus") and "gpus" in p and "gpus" in best:
            entry["gpus"] = p["gpus"]
        out["runners_up"].append(entry)
    return out


def _fmt_fields(f: dict) -> str:
    return Plan(**f).label()


def render_explanation(ex: dict) -> str:
    b = ex["best"]
    lines = [f"Best plan: {_fmt_fields(b['fields'])} — {b['step_time_s']:.4g} s per step"
             + (f", MFU {b['mfu']:.1%}" if b.get("mfu") is not None else "")
             + (" (proved optimal under the model)" if ex.get("optimal") else "")]
    if b["bottleneck"]:
        where = f" on pipeline stage {b['bottleneck_stage']}" if b.get("bottleneck_stage") is not None else ""
        share = f" ({b['bottleneck_share']:.0%} of the step)" if b["bottleneck_share"] is not None else ""
        lines.append(f"  bottleneck: {term_label(b['bottleneck'])}{where}, {b['bottleneck_s']:.4g} s{share}")
        rest = sorted(((k, v) for k, v in b["breakdown_s"].items() if k != b["bottleneck"] and v > 0),
                      key=lambda kv: -kv[1])
        if rest:
            lines.append("  then: " + ", ".join(f"{term_label(k)} {v:.3g} s" for k, v in rest))
    if b.get("schedule_gain"):
        lines.append(f"  schedule: {b['schedule_gain']}")
    if b.get("precision_gain"):
        lines.append(f"  precision: {b['precision_gain']}")
    if b.get("memory_total_bytes") is not None and b.get("hbm_bytes"):
        lines.append(f"  memory: {b['memory_total_bytes'] / GiB:.1f} of {b['hbm_bytes'] / GiB:.1f} GiB on the "
                     f"most loaded GPU, mostly {b['memory_dominant']}")
    for line in b.get("pools_why") or []:
        lines.append(f"  pool {line}")
    for r in ex["runners_up"]:
        diff = ", ".join(f"{k} {a}→{c}" for k, (a, c) in r["differs_in"].items()) or "split points only"
        loses = ", ".join(f"{term_label(x['term'])} +{x['extra_s']:.3g} s" for x in r["loses_on"])
        gains = ", ".join(f"{term_label(x['term'])} −{x['saved_s']:.3g} s" for x in r["gains_on"])
        if "tflops_per_gpu_gap" in r:   # ranked per GPU: the gap that matters is per-GPU throughput
            gap = f"−{r['tflops_per_gpu_gap']:.3g} TFLOP/s per GPU"
        else:
            gap = f"+{r['gap_s']:.3g} s, +{r['gap_fraction']:.1%}"
        if r.get("gpus") is not None:
            gap = f"{r['gpus']} GPUs, " + gap
        s = (f"#{r['rank']}: {_fmt_fields(r['fields'])} — {r['step_time_s']:.4g} s "
             f"({gap}); differs in {diff}")
        if loses:
            s += f"; loses on {loses}"
        if gains:
            s += f"; gains on {gains}"
        if r.get("schedule_gain"):
            s += f"; {r['schedule_gain']}"
        lines.append(s)
    return "\n".join(lines)
