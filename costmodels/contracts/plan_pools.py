"""The Plan's heterogeneous-cluster fields, ``pools`` and ``stage_pools``: checks, label, placement.

Kept out of ``costmodels/contracts/plan.py`` so that the frozen contract stays readable: a uniform plan
never reaches this module.

``pools`` lists the cluster's pools as searched, ``[profile, GPUs]`` each (a shipped profile
name or a path); ``stage_pools[r]`` is the pool of pipeline rank ``r``. A stage's whole tp·dp
group lives in its pool (tp innermost, so inside a node); dp is the same for every stage (the
micro-batch stream is shared).

**Rank → GPU** (``gpu_of_rank``): the pools occupy the cluster's GPUs in order (pool 0's GPUs
first); inside a pool, its pipeline ranks take consecutive blocks of tp·dp GPUs in pipeline
order from the pool's first GPU, and inside a block the placement ``tp,dp,pp`` holds (torch rank
``tp_i + tp·(dp_i + dp·r)`` is GPU ``dp_i·tp + tp_i`` of the block). GPUs of a pool past its
last block stay idle. The torch ranks are those of the uniform plan: only which GPU each one
lands on changes, so the runtime runs a pooled plan unchanged.
"""
from __future__ import annotations

from costmodels.contracts.checks import LIMITS, is_int, quote
from costmodels.contracts.errors import PlanError


def check_pool_fields(plan) -> tuple[tuple[tuple[str, int], ...], tuple[int, ...]]:
    """``(pools, stage_pools)`` as tuples, or a PlanError naming the problem and the fix."""
    pools, sp = plan.pools, plan.stage_pools
    if pools is None or sp is None:
        raise PlanError("plan fields 'pools' and 'stage_pools' go together: give both (a pooled plan) "
                        "or neither (a uniform one)")
    if isinstance(pools, (str, bytes, dict)) or not hasattr(pools, "__iter__"):
        raise PlanError(f"plan field 'pools' must be a list of [profile, GPUs] pairs; got {quote(pools)}")
    out = []
    for p in pools:
        if (isinstance(p, (str, bytes, dict)) or not hasattr(p, "__len__") or len(p) != 2
                or not isinstance(p[0], str) or not p[0] or not is_int(p[1])
                or not 1 <= p[1] <= LIMITS["gpus"]):
            raise PlanError(f"plan field 'pools' entry {quote(p)} must be [profile name or path, GPU count]")
        out.append((p[0], int(p[1])))
        if len(out) > 64:
            raise PlanError("plan field 'pools' lists more than 64 pools; merge pools of one profile")
    if not out:
        raise PlanError("plan field 'pools' is empty; leave 'pools' and 'stage_pools' out for a uniform plan")
    if isinstance(sp, (str, bytes, dict)) or not hasattr(sp, "__iter__"):
        raise PlanError(f"plan field 'stage_pools' must be a list of pool indices; got {quote(sp)}")
    sp = tuple(sp)
    if len(sp) != plan.pp or not all(is_int(q) and 0 <= q < len(out) for q in sp):
        raise PlanError(f"plan field 'stage_pools'={quote(list(sp))} must give one pool index "
                        f"(0..{len(out) - 1}) per pipeline rank (pp={plan.pp})")
    if plan.placement != "tp,dp,pp":
        raise PlanError(f"a pooled plan keeps each stage's tp·dp group inside its pool: placement "
                        f"must be tp,dp,pp (got {plan.placement})")
    group = plan.tp * plan.dp
    for q, (ref, count) in enumerate(out):
        used = sp.count(q) * group
        if used > count:
            raise PlanError(f"plan puts {sp.count(q)} stage(s) of tp·dp = {group} GPUs on pool {q} "
                            f"({ref}), {used} GPUs, but it has {count}; move stages to another pool "
                            "or lower tp·dp")
    return tuple(out), tuple(int(q) for q in sp)


def short_name(ref: str) -> str:
    """A pool's profile as the label shows it: the file's stem for a path."""
    base = ref.replace("\\", "/").rsplit("/", 1)[-1]
    return base[:-5] if base.endswith(".toml") else base


def pools_label(plan) -> str:
    """The pipeline's pools in order, e.g. ``pools:h100-80g-sxm×4+a100-80g-sxm×8``."""
    runs: list[list] = []
    for q in plan.stage_pools:
        if runs and runs[-1][0] == q:
            runs[-1][1] += 1
        else:
            runs.append([q, 1])
    return "pools:" + "+".join(f"{short_name(plan.pools[q][0])}×{k}" for q, k in runs)


def pool_usage(plan) -> list[dict]:
    """Per pool: GPUs the plan uses and GPUs it leaves idle (the output says so)."""
    group = plan.tp * plan.dp
    return [{"pool": q, "profile": ref, "gpus": count, "used": plan.stage_pools.count(q) * group,
             "idle": count - plan.stage_pools.count(q) * group, "stages": plan.stage_pools.count(q)}
            for q, (ref, count) in enumerate(plan.pools)]


def gpu_of_rank(plan, rank: int) -> tuple[int, int]:
    """(pool, GPU index inside the pool) of torch rank ``rank`` (module docstring's rule)."""
    group = plan.tp * plan.dp
    r, inner = divmod(int(rank), group)
    q = plan.stage_pools[r]
    block = plan.stage_pools[:r].count(q)
    return q, block * group + inner


def global_gpu(plan, rank: int) -> int:
    """The cluster-wide GPU index of torch rank ``rank`` (pools in order)."""
    q, i = gpu_of_rank(plan, rank)
    return sum(c for _, c in plan.pools[:q]) + i
