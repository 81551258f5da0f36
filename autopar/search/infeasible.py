"""When nothing fits: the smallest memory any plan reaches, what dominates it, what would fit.

``min_memory`` solves the memory-minimisation version of the split program (``SplitModel`` with
``objective="memory"``: minimise the most loaded GPU, no HBM constraint) over configurations in
the order of their memory lower bound, stopping when the next bound is no smaller than the best
plan found (so the minimum is exact under the model when ``exact`` is true). The explanation then
tries the remedies the user can apply — more GPUs, full recompute, ZeRO-3 (when pinned away),
a larger GPU — each by the same minimisation.
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

from autopar.search.precision_space import search_precisions
from autopar.search.space import Shape, configurations

GiB = 1024 ** 3
MEMORY_TERMS = ("params", "grads", "optimizer", "activations")


@dataclass
class MinMemory:
    total: float                    # bytes on the most loaded GPU (the evaluator's figure)
    plan: object
    prediction: dict
    exact: bool


def min_memory(costs, gpus: int, global_batch: int, fix: dict | None, allow_cross_node_tp: bool = False,
               budget_s: float = 5.0, max_solves: int = 200) -> MinMemory | None:
    from autopar.search.split_model import SplitModel
    fix = dict(fix or {})
    fixed_stages = fix.get("stages")
    shape = Shape.of(costs.table)
    heap, tie = [], itertools.count()
    for c in configurations(shape, gpus, global_batch, costs.profile.link_domain, fix, allow_cross_node_tp,
                             precisions=search_precisions(costs.profile, fix)):
        if fixed_stages is not None and len(fixed_stages) != c.pp * c.vpp:
            continue
        # only the smallest micro-batch can reach the minimum: activations grow with it
        if "micro_batch_size" not in fix and c.micro_batch_size != 1:
            continue
        terms = costs.terms(c)
        heapq.heappush(heap, (terms.memory_lower_bound(), next(tie), c, terms))
    best: MinMemory | None = None
    exact, solves = True, 0
    t0 = time.perf_counter()   # the budget is for the solves: listing alone can outlast it at scale
    while heap:
        lb, _, c, terms = heapq.heappop(heap)
        if best is not None and lb >= best.total:
            break
        if solves >= max_solves or (solves and time.perf_counter() - t0 > budget_s):
            exact = False
            break
        res = SplitModel(terms, objective="memory", time_limit_s=2.0, fixed_stages=fixed_stages).solve()
        solves += 1
        if res.stages is None:
            continue
        if res.status != "optimal":
            exact = False
        plan = c.plan(res.stages)
        pred = costs.evaluate(plan)
        total = float(pred["memory_bytes"]["total"])
        if best is None or total < best.total:
            best = MinMemory(total, plan, pred, exact)
    if best is not None:
        best.exact = exact
    return best


def explain_infeasible(costs, *, gpus, global_batch, fix, objective, target_step_time_s, dropped, stats,
                       allow_cross_node_tp=False, context=None) -> str:
    ctx = context or {}
    model = ctx.get("model", costs.table.model)
    hbm = costs.profile.hbm_bytes
    if objective != "step_time":
        return _explain_target(costs, gpus, global_batch, fix, objective, target_step_time_s, stats, model)
    mm = min_memory(costs, gpus, global_batch, fix, allow_cross_node_tp)
    if mm is None:
        return (f"no plan for {model} fits on {gpus} × {costs.profile.name}: no split of any "
                "configuration exists; pin fewer fields with --fix")
    mem = mm.prediction["memory_bytes"]
    parts = {k: float(mem.get(k, 0.0)) for k in MEMORY_TERMS}
    dom = max(parts, key=parts.get)
    lines = [f"no plan for {model} fits on {gpus} × {costs.profile.name} (global batch {global_batch}): "
             f"the smallest memory any plan reaches is {mm.total / GiB:.1f} GiB per GPU "
             f"{'' if mm.exact else '(best found) '}against {hbm / GiB:.1f} GiB of HBM, with "
             f"{mm.plan.label()}; the largest term is {dom} ({parts[dom] / GiB:.1f} GiB"
             + "".join(f", {k} {v / GiB:.1f}" for k, v in parts.items() if k != dom) + " GiB)."]
    fixes = []
    # more GPUs
    sure = True   # every count below was answered exactly, so "none" is a proof, not a budget's end
    for mult in (2, 4, 8, 16, 32, 64):
        g2 = gpus * mult
        m2 = min_memory(costs, g2, global_batch, _drop(fix, ("dp",)), allow_cross_node_tp, budget_s=2.0,
                        max_solves=40)
        if m2 is not None and m2.total <= hbm:
            fixes.append(f"more GPUs: {g2} fit ({m2.total / GiB:.1f} GiB with {m2.plan.label()})")
            break
        sure = sure and m2 is not None and m2.exact
    else:
        fixes.append(f"more GPUs: none up to {gpus * 64} fit at this batch" if sure else
                     f"more GPUs: none found up to {gpus * 64} within the check's budget (run the search "
                     "at a larger --gpus to be sure)")
    # recompute / ZeRO-3 when the user pinned them away
    for field_, value, label in (("recompute", "full", "full recompute"), ("zero", 3, "ZeRO-3")):
        if field_ in fix and fix[field_] != value:
            f2 = dict(fix)
            f2[field_] = value
            m2 = min_memory(costs, gpus, global_batch, f2, allow_cross_node_tp, budget_s=2.0, max_solves=40)
            if m2 is not None and m2.total <= hbm:
                fixes.append(f"{label}: --fix {field_}={value} fits ({m2.total / GiB:.1f} GiB)")
            elif m2 is not None:
                fixes.append(f"{label} alone is not enough ({m2.total / GiB:.1f} GiB)")
        elif field_ not in fix:
            if field_ == "zero" and mm.plan.dp == 1:
                fixes.append("ZeRO-3 does not help here: it shards model states across data-parallel "
                             "replicas, and the smallest plan already needs all GPUs for tp·pp")
            else:
                fixes.append(f"{label} is already in the search (the smallest plan above uses "
                             f"{field_}={getattr(mm.plan, field_)})")
    if fix:
        f2 = {k: v for k, v in fix.items() if k in ("attention", "placement")}
        if f2 != fix:
            m2 = min_memory(costs, gpus, global_batch, f2, allow_cross_node_tp, budget_s=2.0, max_solves=40)
            if m2 is not None and m2.total <= hbm:
                fixes.append(f"unpinning --fix {','.join(k for k in fix if k not in f2)} fits "
                             f"({m2.total / GiB:.1f} GiB with {m2.plan.label()})")
    # a larger GPU: memory needs do not depend on the GPU apart from its reserve
    bigger = _larger_gpus(costs, mm)
    if bigger:
        fixes.append("a larger GPU: " + ", ".join(bigger))
    else:
        fixes.append("a larger GPU: no shipped profile has enough HBM")
    return "\n".join(lines + ["what would make it fit: " + "; ".join(fixes) + "."])


def _drop(fix, keys):
    return {k: v for k, v in (fix or {}).items() if k not in keys}


def _larger_gpus(costs, mm) -> list[str]:
    from costmodels.profiles.hardware_files import list_profiles, load_profile
    out = []
    reserve_here = float(mm.prediction["memory_bytes"].get("reserve", costs.profile.memory_reserve_bytes))
    need = mm.total - reserve_here
    for name in list_profiles():
        try:
            p = load_profile(name)
        except Exception:  # a broken shipped profile must not hide the explanation
            continue
        if p.hbm_bytes <= costs.profile.hbm_bytes:
            continue
        if need + p.memory_reserve_bytes <= p.hbm_bytes:
            out.append(f"{name} ({p.hbm_bytes / GiB:.0f} GiB)")
    return out


def _explain_target(costs, gpus, global_batch, fix, objective, target, stats, model) -> str:
    if target is None:
        return (f"no plan for {model} fits on up to {gpus} × {costs.profile.name}; "
                "run with --objective step_time for the memory explanation")
    return (f"no plan for {model} on up to {gpus} × {costs.profile.name} reaches the target step time "
            f"{target:.4g} s at global batch {global_batch} ({stats.pruned_target} configurations are "
            f"too slow, {stats.pruned_memory + stats.infeasible} do not fit); allow more GPUs (--gpus), "
            "relax the target, or drop --fix")
