"""Why the best plan wins: its bottleneck, and what each runner-up loses on.

Works on a plans file (``autopar search -o``) or anything holding estimate results. Pure data in,
data out (``explain_plans``) plus a text rendering (``render_explanation``).

* The best plan's bottleneck is the largest term of its step-time breakdown (``breakdown_s``:
  compute, recompute, bubble, exposed dp / tp / pp / ZeRO communication), with its share of the
  step; plus its memory headroom on the most loaded GPU and which memory term dominates.
* Each runner-up: how much slower (or, for per-GPU throughput, less efficient) it is, which
  breakdown terms grew the most against the best (the ones that explain the gap), and which plan
  fields differ.
"""
from __future__ import annotations

from typing import Any

from costmodels.plans_file import PlanResult

TERM_LABELS = {"compute": "compute", "recompute": "recomputation", "bubble": "pipeline bubble",
               "dp_exposed": "exposed data-parallel all-reduce", "tp_exposed": "exposed tensor-parallel communication",
               "pp_exposed": "exposed pipeline send/recv", "zero_exposed": "exposed ZeRO gathers"}
FIELDS = ("dp", "tp", "pp", "vpp", "micro_batch_size", "zero", "recompute", "sequence_parallel",
          "schedule", "attention", "placement")
GiB = 1024 ** 3


def _fields(p: dict) -> dict:
    d = PlanResult.from_dict(p).plan.to_dict()
    return {k: d[k] for k in FIELDS}


def explain_plans(data: dict[str, Any]) -> dict[str, Any]:
    plans = data["plans"]
    best = plans[0]
    bd = {k: float(v) for k, v in (best.get("breakdown_s") or {}).items()}
    step = float(best["step_time_s"])
    bottleneck = max(bd, key=bd.get) if bd else None
    mem = best.get("memory_bytes") or {}
    mem_terms = {k: float(mem[k]) for k in ("params", "grads", "optimizer", "activations") if k in mem}
    out = {
        "best": {
            "rank": best.get("rank", 1), "fields": _fields(best), "step_time_s": step,
            "bottleneck": bottleneck, "bottleneck_s": bd.get(bottleneck) if bottleneck else None,
            "bottleneck_share": (bd[bottleneck] / step) if bottleneck and step > 0 else None,
            "breakdown_s": bd,
            "memory_total_bytes": mem.get("total"), "hbm_bytes": best.get("hbm_bytes"),
            "memory_dominant": max(mem_terms, key=mem_terms.get) if mem_terms else None,
            "mfu": best.get("mfu"),
        },
        "runners_up": [],
        "objective": data.get("objective", "step_time"),
        "optimal": data.get("optimal"),
    }
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
                 "differs_in": {k: [bf[k], pf[k]] for k in FIELDS if bf[k] != pf[k]}}
        if data.get("objective") == "throughput_per_gpu" and best.get("tflops_per_gpu") and p.get("tflops_per_gpu"):
            entry["tflops_per_gpu_gap"] = float(best["tflops_per_gpu"]) - float(p["tflops_per_gpu"])
        if data.get("objective") in ("throughput_per_gpu", "fewest_gpus") and "gpus" in p and "gpus" in best:
            entry["gpus"] = p["gpus"]
        out["runners_up"].append(entry)
    return out


def _fmt_fields(f: dict) -> str:
    s = f"dp={f['dp']} tp={f['tp']} pp={f['pp']}"
    if f["vpp"] > 1:
        s += f" vpp={f['vpp']}"
    s += f" mbs={f['micro_batch_size']} zero={f['zero']} recompute={f['recompute']}"
    if f["sequence_parallel"]:
        s += " sp"
    return s + f" {f['schedule']}"


def render_explanation(ex: dict) -> str:
    b = ex["best"]
    lines = [f"Best plan: {_fmt_fields(b['fields'])} — {b['step_time_s']:.4g} s per step"
             + (f", MFU {b['mfu']:.1%}" if b.get("mfu") is not None else "")
             + (" (proved optimal under the model)" if ex.get("optimal") else "")]
    if b["bottleneck"]:
        lines.append(f"  bottleneck: {TERM_LABELS.get(b['bottleneck'], b['bottleneck'])}, "
                     f"{b['bottleneck_s']:.4g} s ({b['bottleneck_share']:.0%} of the step)")
        rest = sorted(((k, v) for k, v in b["breakdown_s"].items() if k != b["bottleneck"] and v > 0),
                      key=lambda kv: -kv[1])
        if rest:
            lines.append("  then: " + ", ".join(f"{TERM_LABELS.get(k, k)} {v:.3g} s" for k, v in rest))
    if b.get("memory_total_bytes") is not None and b.get("hbm_bytes"):
        lines.append(f"  memory: {b['memory_total_bytes'] / GiB:.1f} of {b['hbm_bytes'] / GiB:.1f} GiB on the "
                     f"most loaded GPU, mostly {b['memory_dominant']}")
    for r in ex["runners_up"]:
        diff = ", ".join(f"{k} {a}→{c}" for k, (a, c) in r["differs_in"].items()) or "split points only"
        loses = ", ".join(f"{TERM_LABELS.get(x['term'], x['term'])} +{x['extra_s']:.3g} s" for x in r["loses_on"])
        gains = ", ".join(f"{TERM_LABELS.get(x['term'], x['term'])} −{x['saved_s']:.3g} s" for x in r["gains_on"])
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
        lines.append(s)
    return "\n".join(lines)
