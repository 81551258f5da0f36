"""Data-parallel gradient sync on the α-β line: which collectives a plan's dp (or HSDP) sync
issues per phase, what they cost, and the (latency, per-parameter) line the search's split
programs read.

Its own module beside ``coefficients`` (which re-exports these names) because ``estimate``
prices the sync per rank and the search reads its line: one owner for both.
"""
from __future__ import annotations

from costmodels.model.comm import collective_latency, collective_time
from costmodels.model.compute import RUNTIME_PRECISIONS
from costmodels.model.context_parallel import hsdp_sync
from costmodels.model.memory import STATE_BYTES
from costmodels.model.step_tail import first_param_gather
from costmodels.profiles.hardware import HardwareProfile
from costmodels.profiles.runtime import RuntimeProfile, load_runtime


def zero_row_collectives(plan, runtime: RuntimeProfile) -> frozenset[str]:
    """Which ZeRO collectives run per row and micro-batch under ``runtime`` (module docstring):
    "fwd" (gather before the forward), "bwd" (gather before the backward), "reduce" (gradient
    reduce-scatter in the backward); empty without ZeRO-2/3 or data parallelism."""
    if plan.dp <= 1 or plan.zero < 2:
        return frozenset()
    per_mb = bool(runtime.zero_reduce_per_micro_batch) or (
        getattr(plan, "pp", 1) > 1 and bool(runtime.pipeline_zero_reduce_per_micro_batch))
    if plan.zero == 3:
        return frozenset({"fwd", "bwd"} | ({"reduce"} if per_mb else set()))
    out = {"reduce"} if per_mb else set()
    if runtime.zero2_gather_per_micro_batch:
        out.add("fwd")
    return frozenset(out)


def grad_bytes(precision: str, runtime: RuntimeProfile) -> float:
    """Bytes per gradient the dp sync moves: the runtime's reduce dtype, else the recipe's."""
    return runtime.grad_reduce_bytes or STATE_BYTES[precision][1]



def dp_sync_collectives(plan, precision: str = "bf16-mixed",
                        phase: str | None = None) -> list[tuple[str, float]]:
    """The gradient sync over dp as ``[(collective kind, bytes per parameter)]``: what
    ``dp_sync`` prices and ``dp_sync_line`` splits into latency and cost per parameter.
    ``phase``: "reduce" (what hides in the backward), "after" (the weights' all-gather after the
    optimizer step that the plan's runtime leaves exposed) or None (both)."""
    if plan.dp <= 1:
        return []
    runtime = load_runtime(getattr(plan, "runtime", None))
    bytes_param = STATE_BYTES[precision][0]
    bytes_grad = grad_bytes(precision, runtime)
    if plan.zero == 0 or (plan.zero == 1 and precision in RUNTIME_PRECISIONS):
        # autopar's runtime runs ZeRO-1 as DDP's all-reduce + the owners' broadcasts after the
        # optimizer step (estimate.zero1_broadcast, never hidden)
        colls = [("all_reduce", bytes_grad, "reduce")]
    else:
        # ZeRO-1 (Megatron's distributed optimizer): reduce-scatter + all-gather; ZeRO-2/3: FSDP2's
        # flat-tensor collectives (ZeRO-3 gathers its parameters per micro-batch, not here)
        rs, ag = ("reduce_scatter", "all_gather") if plan.zero == 1 else \
            ("reduce_scatter_tensor", "all_gather_into_tensor")
        row = zero_row_collectives(plan, runtime)
        after = "reduce" if runtime.param_gather_overlap is None else "after"
        colls = [] if "reduce" in row else [(rs, bytes_grad, "reduce")]
        if plan.zero < 3 and "fwd" not in row:
            colls.append((ag, bytes_param, after))
    if phase == "after":   # the exposed part only
        share = 1.0 - (runtime.param_gather_overlap or 0.0)
        return [(k, b * share) for k, b, p in colls if p == "after" and share > 0]
    return [(k, b) for k, b, p in colls if phase is None or p == phase]


def dp_sync(params_per_gpu: float, plan, profile: HardwareProfile, tier: str,
            precision: str = "bf16-mixed", phase: str | None = "reduce") -> tuple[str, float, float]:
    """(collective name, bytes per GPU, seconds) of the once-per-step gradient sync over dp (the
    ``phase`` of it, ``dp_sync_collectives``): on the α-β line, not a measured curve
    (``comm.collective_time``), so the search can keep it linear in the parameters of a stage."""
    colls = dp_sync_collectives(plan, precision, phase)
    if getattr(plan, "dp_shard", None):   # HSDP: shard group, then across replicas
        name, nbytes, seconds, _ = hsdp_sync(params_per_gpu, plan, profile, colls, phase,
                                             grad_bytes(precision, load_runtime(getattr(plan, "runtime", None))))
        return name, nbytes, seconds
    first_b, first_s = _first_gather(plan, profile, tier, precision, phase)   # step_tail.py
    if not colls:
        return ("all_gather", first_b, first_s) if first_s else ("none", 0.0, 0.0)
    t = dp_link(profile, plan, tier)
    nbytes = seconds = 0.0
    for kind, per_param in colls:
        b, s = collective_time(kind, per_param * params_per_gpu, plan.dp, t, line=True)
        nbytes, seconds = nbytes + b, seconds + s
    return "+".join(k for k, _ in colls), nbytes + first_b, seconds + first_s


def dp_sync_line(plan, profile: HardwareProfile, tier: str,
                 precision: str = "bf16-mixed", phase: str = "reduce") -> tuple[float, float]:
    """``dp_sync``'s seconds as ``(λ_d, γ_d)``: its fixed latency (every collective's
    ``steps·α``) and the rest of one parameter's time, the cost per parameter; (0, 0) without dp.
    ``λ_d + γ_d·Π`` is ``dp_sync(Π)`` up to λ_d's rounding (about 1e-10 relative), far below the
    integer program's unit."""
    colls = dp_sync_collectives(plan, precision, phase)
    if getattr(plan, "dp_shard", None):   # HSDP (context_parallel.hsdp_sync)
        latency = hsdp_sync(1.0, plan, profile, colls, phase,
                            grad_bytes(precision, load_runtime(getattr(plan, "runtime", None))))[3]
        return latency, dp_sync(1.0, plan, profile, tier, precision, phase)[2] - latency
    first_s = _first_gather(plan, profile, tier, precision, phase)[1]   # a constant a step (step_tail.py)
    if not colls:
        return first_s, 0.0
    t = dp_link(profile, plan, tier)
    latency = sum(collective_latency(kind, plan.dp, t) for kind, _ in colls) + first_s
    return latency, dp_sync(1.0, plan, profile, tier, precision, phase)[2] - latency


def _first_gather(plan, profile: HardwareProfile, tier: str, precision: str, phase) -> tuple[float, float]:
    """The "after" phase's exposed first parameter all-gather bucket of an overlapped distributed
    optimizer (costmodels.model.step_tail.first_param_gather); (0, 0) in every other phase."""
    if phase != "after" or plan.dp <= 1 or precision in RUNTIME_PRECISIONS:
        return 0.0, 0.0
    runtime = load_runtime(getattr(plan, "runtime", None))
    if not runtime.param_gather_exposed_buckets:
        return 0.0, 0.0
    return first_param_gather(plan, runtime, dp_link(profile, plan, tier), STATE_BYTES[precision][0])


def dp_link(profile: HardwareProfile, plan, tier: str):
    """The dp group's link tier (``HardwareProfile.group_link``); ``tier`` is its name, which a
    plan-like object without a placement (a hand-built one) falls back to."""
    if hasattr(plan, "placement") and hasattr(plan, "tp"):
        return profile.group_link(plan, "dp")
    return profile.tier(tier)
