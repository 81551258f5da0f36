"""What autopar's runtime can run: the one owner of each rule by which it refuses a plan.

The search proposes only plans these rules accept (``autopar.search.space`` calls
``check_runnable`` on every configuration it lists), and the runtime checks the same rules
before it starts a process group or spawns a rank (``autopar.runtime.assemble.prelaunch``), so a plan the
search returns never fails at launch, and a plan the runtime refuses fails in one line, at once.

Each rule is one function raising ``PlanError`` that names the plan field and the fix:

* ``check_schedule(plan, m)`` — micro-batches per step against the schedule: GPipe runs any
  ``m >= 1``; torch's ``Schedule1F1B`` needs ``m >= pp`` (Megatron's 1F1B runs any ``m``:
  ``clips_warmup``); interleaved 1F1B needs ``m`` to be a
  multiple of ``pp`` (Megatron's groups of ``pp`` micro-batches, what the cost model prices);
  torch's ``ScheduleInterleavedZeroBubble`` needs ``m`` divisible by its rounds ``max(1, m // pp)``;
  ``ScheduleZBVZeroBubble`` runs any ``m``; ``ScheduleDualPipeV`` needs ``m >= 2·pp`` (its stages).
* ``check_split_backward(plan)`` — no ZeRO-3 (dp > 1) under a split-backward schedule.
* ``check_fsdp_tied(plan, dims)`` — no ZeRO-2/3 (dp > 1) under a V schedule for a model that
  ties its embedding to its head (``ModelDims.tied_ends``).
* ``check_tensor_parallel(plan, dims)`` — ``tp`` divides ``heads``, ``kv_heads`` and ``ffn``
  (each rank owns whole heads and an equal slice of the MLP); with sequence parallel it also
  divides the sequence length.
* ``check_context_parallel(plan, dims)`` — ``2·cp`` divides the sequence (each sequence is cut
  into ``2·cp`` chunks for causal load balance); with sequence parallel, tp divides ``seq / cp``.
  (cp needs nothing of the heads beyond what tp needs: the runtime all-gathers K and V.)
* ``costmodels.contracts.split.check_stage_rows`` (owned there, shared with the cost model) — ``pp·vpp``
  virtual stages over at most ``rows`` rows, pinned ``stages`` ending at the last row.

The plan's own consistency (``vpp > 1`` needs a multi-stage schedule, which needs ``pp >= 2``;
``zb-v`` / ``dualpipe-v`` need ``vpp = 2``;
sequence parallel needs ``tp >= 2``; ``stages`` contiguous, one per virtual stage) is
``Plan.__post_init__``'s, and whole micro-batches per replica is ``Plan.num_micro_batches``'.
Rules about the model's code (an op the tensor-parallel rewrite cannot shard, a forward that
cannot be cut into rows) need torch and the model: ``autopar.runtime.assemble.prelaunch`` checks those.

``plan`` may be a ``Plan`` or anything with its fields (the search's configurations).
Torch-free, like all of ``costmodels``.
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, V_SCHEDULES
from costmodels.contracts.split import check_stage_rows


@dataclass(frozen=True)
class ModelDims:
    """The model sizes the rules read; ``None`` = unknown (the rule that needs it is skipped;
    the runtime's pre-launch probe of the rewrite still checks the model itself)."""

    rows: int | None = None        # layer-table rows: embedding, blocks, head
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None         # the MLP's inner width
    seq: int | None = None         # tokens per sample
    tied_ends: bool | None = None  # the first and last rows share a parameter (tied embedding / head)
    experts: int | None = None     # routed experts per MoE layer (0: a dense model)

    @classmethod
    def of_table(cls, table) -> ModelDims:
        """From a ``LayerTable`` (its MLP width is not recorded: ``ffn`` stays unknown)."""
        return cls(rows=len(table.rows), heads=table.heads, kv_heads=table.kv_heads,
                   seq=table.seq, experts=max((getattr(r, "experts", 0) for r in table.rows), default=0))


def check_runnable(plan, dims: ModelDims | None = None, num_micro_batches: int | None = None) -> None:
    """Raise PlanError (one line naming the field and the fix) when the runtime would refuse
    ``plan`` for a model of ``dims`` running ``num_micro_batches`` micro-batches per step;
    ``None`` for either skips the rules that need it."""
    dims = dims or ModelDims()
    check_experts(plan, dims)
    check_split_backward(plan)
    check_fsdp_tied(plan, dims)
    if num_micro_batches is not None:
        check_schedule(plan, num_micro_batches)
    check_tensor_parallel(plan, dims)
    check_context_parallel(plan, dims)
    if dims.rows is not None:
        check_stage_rows(plan, dims.rows)


def is_runnable(plan, dims: ModelDims | None = None, num_micro_batches: int | None = None) -> bool:
    """``check_runnable`` as a predicate (what the search's enumeration filters with)."""
    try:
        check_runnable(plan, dims, num_micro_batches)
    except PlanError:
        return False
    return True


def check_experts(plan, dims: ModelDims) -> None:
    """``ep`` shards whole experts (it divides the routed experts of every MoE layer) of a model
    that has them; autopar's own runtime runs ep with DDP or ZeRO-1/2/3, pp, tp and sequence
    parallel on the dense parts (attention, router, shared experts; each tp rank routing its own
    tokens, so an ep group may take tp and cp ranks as well as dp ones, as the contract's ep·etp
    dividing dp·cp·tp allows: ``autopar.runtime.step.expert_mesh``) and recompute
    (``autopar.rewrite.experts``, ``autopar.runtime.step.experts``), but
    not expert tensor parallelism (etp); the cost model prices etp for the runtimes that run it
    (Megatron-core, torchtitan)."""
    ep, etp = getattr(plan, "ep", 1), getattr(plan, "etp", 1)
    runtime = str(getattr(plan, "runtime", "autopar") or "autopar").split(":")[0]
    if ep == 1 and etp == 1:
        return
    if dims.experts == 0:
        raise PlanError(f"plan field 'ep'={ep} / 'etp'={etp} shards the experts of a Mixture of "
                        "Experts, but this model has none; use ep=1, etp=1")
    if dims.experts and dims.experts % ep:
        raise PlanError(f"plan field 'ep'={ep} does not divide the {dims.experts} routed experts; "
                        f"choose ep in {divisors(dims.experts)}")
    if runtime == "autopar" and etp > 1:
        raise PlanError(f"plan field 'etp'={etp}: autopar's own runtime does not run expert tensor "
                        "parallelism (it keeps each expert whole on its ep rank; tp shards the dense "
                        "parts); use etp=1 (or plan for runtime megatron and export)")


def check_schedule(plan, num_micro_batches: int) -> None:
    """Micro-batches per step (``global batch / (dp·micro_batch_size)``) the schedule can run."""
    m, pp, schedule = num_micro_batches, plan.pp, plan.schedule
    if m < 1:
        raise PlanError(f"{m} micro-batches per step: need at least 1; raise the global batch "
                        "or lower 'micro_batch_size'")
    if pp == 1:
        return
    if schedule == "1f1b" and m < pp and not clips_warmup(plan):
        raise PlanError(f"schedule '1f1b' with pp={pp} needs at least pp micro-batches per step "
                        f"but gets {m} (global batch / (dp·micro_batch_size)); raise the global "
                        "batch, lower 'micro_batch_size', or use schedule 'gpipe'")
    if schedule == "interleaved-1f1b" and m % pp:
        raise PlanError(f"schedule 'interleaved-1f1b' with pp={pp} needs the micro-batches per "
                        f"step to be a multiple of pp but gets {m} (global batch / "
                        "(dp·micro_batch_size)); change the global batch or 'micro_batch_size', "
                        f"or use schedule '{'1f1b' if m >= pp else 'gpipe'}'")
    if schedule == "interleaved-zb":
        rounds = max(1, m // pp)
        if m % rounds:
            raise PlanError(f"schedule 'interleaved-zb' with pp={pp} runs micro-batches in {rounds} "
                            f"rounds (micro-batches // pp), which must divide the {m} micro-batches "
                            "per step (torch's ScheduleInterleavedZeroBubble); use a multiple of pp "
                            "micro-batches (change the global batch or 'micro_batch_size')")
    if schedule == "dualpipe-v" and m < 2 * pp:
        raise PlanError(f"schedule 'dualpipe-v' with pp={pp} needs at least 2·pp = {2 * pp} "
                        f"micro-batches per step (one per stage) but gets {m}; raise the global "
                        "batch, lower 'micro_batch_size', or use schedule 'zb-v'")


def clips_warmup(plan) -> bool:
    """Whether the plan's runtime runs 1F1B with fewer micro-batches than stages: Megatron-core's
    ``forward_backward_pipelining_without_interleaving`` clips each rank's warm-up to the step's
    micro-batches (``num_warmup_microbatches = min(pp - rank - 1, num_microbatches)``,
    megatron/core/pipeline_parallel/schedules.py), so ``m < pp`` runs, with a bubble of
    ``(pp - 1)/(m + pp - 1)``; torch's ``Schedule1F1B`` refuses it."""
    return str(getattr(plan, "runtime", "") or "").split(":")[0] == "megatron"


def check_split_backward(plan) -> None:
    """ZeRO-3 cannot compose with a split-backward schedule (``interleaved-zb``, ``zb-v``,
    ``dualpipe-v``): torch computes the weight gradients (W) after the input gradients (B), from
    the autograd graph of the forward, but FSDP2 re-shards the parameters after that forward and
    gathers them anew for backward, so W lands on parameters the step no longer reduces (the
    gradients come out wrong, measured on gloo). ZeRO-2 keeps the parameters gathered from the
    first forward to the last backward and composes."""
    if plan.schedule in SPLIT_BACKWARD_SCHEDULES and plan.zero == 3 and plan.dp > 1 and plan.pp > 1:
        raise PlanError(f"schedule '{plan.schedule}' splits the backward into input and weight "
                        "passes, which ZeRO-3's re-sharding after forward cannot run (torch's "
                        "split backward needs the forward's parameters); use zero=2 or a schedule "
                        "without the split (interleaved-1f1b, 1f1b)")


def check_fsdp_tied(plan, dims: ModelDims) -> None:
    """ZeRO-2/3 shard each stage with its own FSDP2 ``fully_shard``; under a V schedule the first
    and the last stage are both on pipeline rank 0, so a tied embedding and head would be one
    Parameter in two FSDP2 groups (its gradient comes out wrong). The runtime checks the general
    case — any parameter two stages of one rank share — on the model itself
    (``autopar.runtime.assemble.prelaunch.check_fsdp_shared``)."""
    if dims.tied_ends and plan.schedule in V_SCHEDULES and plan.zero >= 2 and plan.dp > 1:
        raise PlanError(f"plan field 'zero'={plan.zero} shards each pipeline stage with FSDP2, but "
                        f"schedule '{plan.schedule}' puts the first and last stage on pipeline "
                        "rank 0 and the model ties its embedding to its head (one parameter in "
                        "both); use zero=1, untie them, or schedule 'interleaved-zb'")


def check_tensor_parallel(plan, dims: ModelDims) -> None:
    """``tp`` splits whole heads, kv heads and an equal MLP slice; SP also splits the sequence."""
    tp = plan.tp
    if tp == 1:
        return
    for name, size in (("heads", dims.heads), ("kv_heads", dims.kv_heads), ("ffn", dims.ffn)):
        if size and size % tp:
            raise PlanError(f"plan field 'tp'={tp} does not divide {name}={size}; choose tp in "
                            f"{divisors(size)}")
    if plan.sequence_parallel and dims.seq and dims.seq % tp:
        raise PlanError(f"plan field 'sequence_parallel' splits the sequence of {dims.seq} tokens "
                        f"over tp={tp}, which does not divide it; choose tp in {divisors(dims.seq)} "
                        "or set sequence_parallel false")


def check_context_parallel(plan, dims: ModelDims) -> None:
    """``cp`` cuts each sequence into ``2·cp`` equal chunks (the causal load balance of
    Megatron-core and torch's ``context_parallel``, rank i holding chunks i and 2·cp − 1 − i), so
    ``2·cp`` divides the sequence; with sequence parallel tp also divides the rank's ``seq/cp``
    tokens. HSDP (``dp_shard``) has no rule of the model's."""
    cp = getattr(plan, "cp", 1)
    if cp <= 1:
        return
    if dims.heads is not None and not dims.heads:
        raise PlanError(f"plan field 'cp'={cp} splits attention over the sequence, but the model "
                        "has no attention heads; set cp=1")
    if dims.seq and dims.seq % (2 * cp):
        ok = [c for c in divisors(dims.seq // 2) if c <= 64]
        raise PlanError(f"plan field 'cp'={cp} cuts the sequence of {dims.seq} tokens into 2·cp = "
                        f"{2 * cp} chunks (causal load balance), which does not divide it; choose cp in {ok}")
    if dims.seq and plan.sequence_parallel and (dims.seq // cp) % plan.tp:
        raise PlanError(f"plan field 'sequence_parallel' splits each cp rank's {dims.seq // cp} tokens "
                        f"over tp={plan.tp}, which does not divide them; change tp or cp, or set "
                        "sequence_parallel false")


def divisors(n: int) -> list[int]:
    """The first dozen divisors of ``n`` (what an error message suggests)."""
    return [d for d in range(1, n + 1) if n % d == 0][:12]
