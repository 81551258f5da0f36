"""What FP8 bought: the best plan of a joint precision search against the best BF16 plan.

When the search's best plan multiplies in FP8 (``precision`` searched jointly with the layout,
``autopar.search.precision_space``), the CLI runs the same search once more with
``precision=bf16`` pinned (one more search: about the time of a BF16-only one) and reports the
gain and what changed — the layout fields that differ and the step's breakdown terms that moved
most (FP8 shortens the matmuls, so compute shrinks and communication's share grows; a layout that
was compute-bound may no longer be the best one).
"""
from __future__ import annotations

LAYOUT = ("dp", "tp", "pp", "vpp", "micro_batch_size", "zero", "recompute", "sequence_parallel", "schedule")


def compare_precisions(best: dict, bf16: dict) -> dict:
    """``{"gain", "bf16_step_s", "changed", "terms", "text"}`` for the plans-file entries ``best``
    (a non-BF16 plan) and ``bf16`` (the best BF16 plan)."""
    gain = bf16["step_time_s"] / best["step_time_s"]
    changed = {k: (bf16.get(k), best.get(k)) for k in LAYOUT if bf16.get(k) != best.get(k)}
    b0, b1 = bf16.get("breakdown_s", {}), best.get("breakdown_s", {})
    terms = sorted(((k, b0.get(k, 0.0), b1.get(k, 0.0)) for k in set(b0) | set(b1)),
                   key=lambda t: -abs(t[2] - t[1]))
    moved = ", ".join(f"{k} {a:.2f} → {b:.2f} s" for k, a, b in terms[:3] if abs(b - a) > 1e-3)
    layout = ("the same layout" if not changed else
              "layout changed: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items()))
    text = (f"{best.get('precision', 'bf16')} gain over the best bf16 plan: {gain:.2f}× "
            f"({bf16['step_time_s']:.2f} → {best['step_time_s']:.2f} s per step); {layout}; {moved}")
    return {"gain": gain, "bf16_step_s": bf16["step_time_s"], "changed": changed,
            "terms": [list(t) for t in terms], "text": text}
