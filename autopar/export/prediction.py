"""What an export says beside the file: the plan's predicted step time under the runtime of the
trainer it is exported to, and a one-line warning when another plan of the same plans file is
faster under that trainer's runtime — so that nobody exports a plan that was best only for the
runtime it was searched under (``autopar search --for TARGET`` searches under the trainer's own).

Only plans the target can express compete (``problems`` of the target). Needs the model, the
hardware and the global batch (a search's plans file has them); without them nothing is said."""
from __future__ import annotations

from autopar.export.common import RUNTIMES

MARGIN = 0.01   # another plan must be this much faster to be worth a warning


def export_notes(given, index: int, target: str, ctx) -> list[str]:
    """Lines for the user (empty when the context cannot price the plan)."""
    if not (ctx.model and ctx.hardware and ctx.global_batch):
        return []
    from autopar.export.api import problems
    runtime = RUNTIMES[target]
    plans = [r.plan for r in given.results]
    gpus = plans[index].world_size
    candidates = [i for i, p in enumerate(plans) if i == index or
                  (p.world_size == gpus and not problems(p, target, ctx))]
    from costmodels.contracts.errors import AutoparError
    from costmodels.model.estimate import estimate
    from costmodels.profiles.cluster import resolve_hardware
    from costmodels.profiles.runtime import load_runtime
    table, times, refused = _table(ctx), {}, {}
    hardware, _ = resolve_hardware(ctx.hardware)
    name = load_runtime(runtime).name
    for i in candidates:
        try:
            times[i] = estimate(table, hardware, plans[i].with_(runtime=name), gpus,
                                ctx.global_batch).step_time_s
        except AutoparError as e:   # the runtime profile refuses what the exporter writes
            refused[i] = str(e)
    under = f"under {target}'s runtime profile ({runtime})"
    if index in refused:
        return [f"note: plan #{index + 1} cannot be priced {under}: {refused[index]}"]
    mine = times[index]
    searched = {p.runtime.split(":")[0] for p in plans}
    lines = [f"plan #{index + 1} {plans[index].label()}: {mine:.3g} s/step predicted {under}"]
    best = min(times, key=times.get)
    if best != index and times[best] < mine * (1 - MARGIN):
        lines.append(f"warning: plan #{best + 1} of {given.source} ({plans[best].label()}) is faster "
                     f"{under}: {times[best]:.3g} s/step; export --index {best + 1}, or search with "
                     f"--for {target}")
    elif searched - {runtime}:
        lines.append(f"note: these plans were searched under the {', '.join(sorted(searched))} runtime; "
                     f"a search with --for {target} may find a plan faster under {runtime}")
    return lines


def _table(ctx):
    from autopar.trace import table_for
    return table_for(ctx.model, micro_batch=1, seq=ctx.seq)
