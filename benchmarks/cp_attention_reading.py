"""The attention reading of the NeMo long-sequence runs (benchmarks/bench_costmodels_cp.py): how much
of each predicted step is the attention kernel, and at what rate, relative to the kernel stack's
figure, the attention must run for the prediction to meet the published step.

Each run is priced twice, once as shipped and once with its kernel stack's ``attention_efficiency``
halved (``stack_fit.stack_override``): the attention's seconds ``A`` are the difference (the kernel's
forward and backward scale with 1 / efficiency), the rest ``X = predicted − A``. The rate the
published step implies is ``A / (published − X)`` of the stack's: 1.00 where the prediction meets the
run. A figure that stays put while cp goes from 2 to 32 and the sequence from 32K to 1M is the
kernel's rate; a cp term would move with cp (the ring's steps, its per-step chunk size). Short runs,
where attention is a small share, read mostly the rest's error and are printed for completeness.
"""
from __future__ import annotations

from cp_bench_rows import table

from costmodels.calibration.stack_fit import stack_override
from costmodels.model.estimate import estimate
from costmodels.profiles.kernel_stacks import stack_figures
from costmodels.profiles.runtime import load_runtime


def attention_reading(sweep: list[dict]) -> list[dict]:
    """Per sweep row (``cp_bench_rows.sweep_step_rows``): attention seconds, its share of the
    predicted step, and the implied rate over the stack's (module docstring)."""
    out = []
    for x in sweep:
        stack = load_runtime(x["plan"].runtime).kernel_stack
        figs = stack_figures(x["hw"], stack) or {}
        if "attention_efficiency" not in figs:
            continue
        spec, seq, batch = x["spec"], x["seq"], x["batch"]
        with stack_override(x["hw"], stack, attention_efficiency=figs["attention_efficiency"][0] / 2):
            slow = estimate(table(spec, seq), x["hw"], x["plan"], x["plan"].world_size, batch).step_time_s
        attn = slow - x["predicted"]
        rest = x["predicted"] - attn
        rate = attn / (x["published"] - rest) if x["published"] > rest and attn > 0 else None
        out.append(dict(id=x["id"], hw=x["hw"], stack=stack, cp=x["plan"].cp, attn=attn,
                        share=attn / x["predicted"], rate=rate))
    return out


def reading_lines(rows: list[dict], calibration: tuple[str, ...]) -> list[str]:
    """The bench's table of ``attention_reading`` rows."""
    lines = ["", "Attention's share of each predicted step, and the rate (over the kernel stack's figure) at",
             "which the attention must run for the prediction to meet the published step",
             "(benchmarks/cp_attention_reading.py; 1.00 = as priced; '–' where the rest of the step alone",
             "exceeds the published step):", "",
             "| row | kernel stack | cp | attention s | share of step | implied attention rate |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        tag = " (calibration)" if r["id"] in calibration else ""
        rate = f"{r['rate']:.2f}" if r["rate"] is not None else "–"
        lines.append(f"| {r['id']}{tag} | {r['stack']} | {r['cp']} | {r['attn']:.2f} | {100 * r['share']:.0f}% "
                     f"| {rate} |")
    return lines
