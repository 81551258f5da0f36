"""What a pipeline stage of FSDP2 under ``torch.distributed.pipelining`` holds beyond ZeRO's table.

The fsdp runtime (torchtitan) runs pp > 1 with torch's pipelining schedules, whose stages drive
FSDP2 by hand. Three things follow that ``memory.stage_memory``'s bf16-mixed recipe (Megatron's:
sharded gradients, one loss per micro-batch, no receive buffers) does not hold; the runtime
profile's ``[memory] torch_pipelining = 1`` switches them on (fsdp.toml, each with its source):

* **Unsharded gradients, accumulated in the reduce dtype, until the stage's last backward.**
  ``_PipelineStageBase.backward_maybe_with_nosync`` calls ``set_requires_gradient_sync(False)``
  and ``set_reshard_after_backward(False)`` before every micro-batch's backward and reduces
  (``post_backward`` of every FSDP param group) only after the last one (torch
  torch/distributed/pipelining/stage.py, the same in the torch 2.5/2.6 of Dec 2024 and in 2.13's
  ``perform_reduce_grad``). With ``reduce_dtype`` unlike ``param_dtype`` FSDP2 then upcasts each
  unsharded gradient into ``unsharded_accumulated_grad`` (torch/distributed/fsdp/_fully_shard/
  _fsdp_param.py ``to_accumulated_grad_if_needed`` / ``accumulate_unsharded_grad_if_needed``):
  torchtitan's MixedPrecisionPolicy(bf16, float32) holds ``grad_reduce_bytes`` (4) per parameter
  of the stage, whole, from its first backward to the end of its last — not ZeRO-2's ``2Ψ/d``.
* **Weights kept gathered after a backward.** The same ``set_reshard_after_backward(False)``:
  ZeRO-2 (torchtitan's ``reshard_after_forward = not pp_enabled``) holds them anyway; under
  ZeRO-3 every forward reshards and the backward that follows gathers the stage again and keeps
  it, so at a backward's end the stage's weights are whole (``gathered``). With a float8
  all-gather (torchao ``WeightWithDynamicFloat8CastTensor.fsdp_post_all_gather``: the unsharded
  parameter is a Float8 tensor over the gathered uint8 data) each linear weight is 1 byte of 2
  (``precision.fp8_weight_share``).
* **The last stage keeps every micro-batch's output** (``output_chunks``, merged and returned
  by ``schedule.step``): ``m`` logits tensors of ``b·s·vocab/tp`` (torchtitan's loss parallel
  shards the vocabulary; ``act_dtype_bytes`` each) for the whole step; and the stage's
  **receive buffers**, allocated once per micro-batch for its input and for its output's
  gradient (``_create_act_recv_info`` / ``_create_grad_recv_info``, each ``b·s·h`` in the
  activations' dtype, ``/tp`` with sequence parallelism), of which the in-flight micro-batches'
  inputs are already counted as their first row's saved input; and each in-flight micro-batch's
  stage output, which ``fwd_cache`` keeps for its backward (its own rows save their inputs only).

The peak is the larger of two moments: the first backward's start (activations of
``inflight``, no gradients yet: torchtitan zeroes them, ``grad = None``, before the step) and a
later backward's start (``later``: one micro-batch fewer, the whole unsharded gradient); with one
micro-batch, the end of its backward (all gradients, no activations). Only ``estimate`` reads the
terms that depend on the micro-batch count (held outputs, receive buffers); ``row_coefficients``
charges the unsharded gradients per row (``grad_bytes_per_param``), so the search's memory bound
stays a bound (a MoE table's states are ``experts.expert_state_bytes``, untouched).

Not yet for Mixture-of-Experts tables: their expert weights are ep shards
(``experts.fix_stage_memory``) that the unsharded-gradient term would have to follow.
"""
from __future__ import annotations

import numpy as np

from costmodels.model.dp_sync import grad_bytes
from costmodels.model.experts import expert_arrays
from costmodels.model.memory import STATE_BYTES, logits
from costmodels.model.precision import fp8_weight_share, stack_key


def applies(plan, runtime, precision: str, zero_dp: int) -> bool:
    """Whether the stage is FSDP2 under torch's pipelining: the runtime says so, pp > 1, a ZeRO
    shard group of more than one rank at ZeRO-2/3, the bf16-mixed recipe (the amp / fp32
    recipes of autopar's own runtime carry their own terms: memory._runtime_peak)."""
    return (bool(getattr(runtime, "torch_pipelining", 0)) and plan.pp > 1 and zero_dp > 1
            and plan.zero >= 2 and precision == "bf16-mixed")


def grad_bytes_per_param(plan, runtime, precision: str, zero_dp: int, g_b: float) -> float:
    """Gradient bytes per parameter of a row on its GPU: the reduce dtype's, unsharded, where
    ``applies``; else ZeRO's ``g_b`` (``memory.model_state_bytes`` per parameter)."""
    return grad_bytes(precision, runtime) if applies(plan, runtime, precision, zero_dp) else g_b


def stage_memory_held(mem: dict[str, float], arr, chunks: list[tuple[int, int]], plan, runtime,
                      precision: str, zero_dp: int, *, m: int, inflight: list[int],
                      later: list[int] | None, act_rows: np.ndarray) -> dict[str, float]:
    """``mem`` (one pipeline rank's breakdown, ``memory.stage_memory`` and the fixes after it) with
    the terms of the module docstring; unchanged where ``applies`` is false. ``act_rows`` the
    per-row activation bytes per micro-batch (``row_coefficients.act_bytes``)."""
    if not applies(plan, runtime, precision, zero_dp) or expert_arrays(arr).any:
        return mem   # MoE: experts are ep shards (experts.fix_stage_memory); not priced here yet
    tp, b, sp = plan.tp, plan.micro_batch_size, plan.sequence_parallel
    rows = np.concatenate([np.arange(s, e) for s, e in chunks])
    params = arr.params[rows] / tp
    share = fp8_weight_share(arr, plan, stack_key(runtime), plan.zero)[rows]
    whole = STATE_BYTES[precision][0] * float((params * share).sum())   # the stage, gathered
    g_full = grad_bytes(precision, runtime) * float(params.sum())
    p_rest = whole if plan.zero == 2 else mem["params"]    # ZeRO-3: shards at rest
    gathered_later = 0.0 if plan.zero == 2 else whole       # ZeRO-3: kept after a backward
    k = b / arr.table.micro_batch
    dt = float(arr.table.act_dtype_bytes)
    held = 0.0
    if any(arr.table.rows[i].kind == "head" for i in rows):
        held = dt * float(logits(arr, b).sum()) / tp       # one micro-batch's output (loss parallel)
    n, per_in = len(arr.table.rows), k / (tp if sp else 1)
    ins = [per_in * float(arr.boundary[s - 1]) if s > 0 else 0.0 for s, _ in chunks]
    outs = [per_in * float(arr.boundary[e - 1]) if e < n else 0.0 for _, e in chunks]
    recv = sum(m * (i + o) for i, o in zip(ins, outs))

    def acts(counts):
        return sum(c * float(act_rows[s:e].sum()) for (s, e), c in zip(chunks, counts))

    def kept(counts):   # fwd_cache keeps each in-flight micro-batch's stage output for its backward
        return sum(c * o for c, o in zip(counts, outs))

    base = mem["activations"] - acts(inflight)   # working set, W inputs, fixes: kept as they are
    first = (p_rest, mem.get("gathered", 0.0), 0.0,
             mem["activations"] + held + recv + kept(inflight) - sum(c * i for c, i in zip(inflight, ins)))
    if later is not None and m > 1:
        act_l = base + acts(later) + kept(later) + m * held + recv - sum(c * i for c, i in zip(later, ins))
    else:   # one micro-batch: the end of its backward, all gradients, no activations
        act_l = held + recv
    second = (p_rest, gathered_later, g_full, act_l)
    p, gat, g, act = max(first, second, key=sum)
    out = dict(mem)
    out.update(params=p, gathered=gat, grads=g, activations=act)
    out["total"] = mem["total"] + (p + gat + g + act) - (
        mem["params"] + mem.get("gathered", 0.0) + mem["grads"] + mem["activations"])
    return out
