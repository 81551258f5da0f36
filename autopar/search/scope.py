"""What the searched space leaves out: the words behind ``optimal: true``.

The search proves its first plan optimal *under the cost model, over the space it searched*
(``autopar.search.space``). That space is smaller than every plan a user could write: some fields
are fixed by convention (flash attention, the tp-innermost placement), some by the runtime's
capabilities, some by the user's flags. ``space_exclusions`` lists them, in words, so that the
plans file and the CLI say over what the claim holds.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from costmodels.contracts.plan import SCHEDULES, SPLIT_BACKWARD_SCHEDULES
from costmodels.profiles.runtime import load_runtime
from costmodels.profiles.runtime_rules import zero_rule


def space_exclusions(fix: dict[str, Any] | None, *, allow_cross_node_tp: bool = False,
                     max_micro_batch: int | None = None, objective: str = "step_time",
                     zero_bubble: bool = False) -> list[str]:
    """One line per family of plans the search did not consider."""
    fix = dict(fix or {})
    rt = load_runtime(fix.get("runtime"))
    out = []
    pinned = sorted(k for k in fix if k not in ("runtime", "stages"))
    if pinned:
        out.append("pinned by --fix: " + ", ".join(f"{k}={fix[k]}" for k in pinned))
    if "stages" in fix:
        out.append("split points pinned by --fix stages")
    if "attention" not in fix:
        out.append("math attention (flash is never slower or larger in the cost model)")
    if "placement" not in fix:
        out.append("placements other than tp,dp,pp")
    if fix.get("attention", "flash") == "flash" and "recompute" not in fix:
        out.append("selective recompute (with flash attention it equals no recompute)")
    if not allow_cross_node_tp and "tp" not in fix:
        out.append("tensor parallelism across nodes (--allow-cross-node-tp)")
    if max_micro_batch is not None:
        out.append(f"micro-batches above {max_micro_batch} (--max-micro-batch)")
    if objective != "step_time":
        out.append("GPU counts other than powers of two below a node and whole nodes above")
    zeros = [z for z in (1, 2, 3) if zero_rule(rt, SimpleNamespace(zero=z, pp=1))]
    if zeros:
        out.append(f"ZeRO-{'/'.join(map(str, zeros))} (runtime '{rt.name}' has none)")
    piped = [z for z in rt.zero_stages if z and zero_rule(rt, SimpleNamespace(zero=z, pp=2))]
    if piped:
        out.append(f"ZeRO-{'/'.join(map(str, piped))} with a pipeline (runtime '{rt.name}')")
    missing = [s for s in SCHEDULES if s not in rt.schedules]
    unasked = [s for s in SPLIT_BACKWARD_SCHEDULES if s in rt.schedules]
    if unasked and not zero_bubble and "schedule" not in fix:
        out.append(f"the zero-bubble schedules {', '.join(unasked)} (--zero-bubble, or pin one with "
                   "--fix schedule=…)")
    if missing:
        out.append(f"schedules {', '.join(missing)} (runtime '{rt.name}' has none)")
    if not rt.uneven_interleaving:
        out.append(f"interleaving when the blocks do not divide pp·vpp (runtime '{rt.name}')")
    elif "vpp" not in fix:
        out.append("uneven interleaving (blocks not dividing pp·vpp) for pipeline depths that have an "
                   "even one, and, where they have none, every vpp but the smallest per largest chunk "
                   "size (pin vpp with --fix to search one)")
    if not rt.sequence_parallel:
        out.append(f"sequence parallelism (runtime '{rt.name}')")
    out.append("interleaved 1F1B whose micro-batch count is not a multiple of pp")
    return out

