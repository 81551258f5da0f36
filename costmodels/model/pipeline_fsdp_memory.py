"""What a pipeline stage of FSDP2 under ``torch.distributed.pipelining`` holds beyond ZeRO's table.

The fsdp runtime (torchtitan) runs pp > 1 with torch's pipelining schedules, whose stages drive
FSDP2 by hand. ``memory.stage_memory``'s bf16-mixed recipe (ZeRO Table 1: 2-byte gradients,
sharded from ZeRO-2 on) misses two per-parameter terms there; the runtime profile's
``[memory] torch_pipelining = 1`` switches them on (fsdp.toml, with its source; autopar.toml has
0: autopar's own stage, autopar/runtime/step/pipeline_stage.py, reduce-scatters every micro-batch
and keeps no outputs, measured by tests/test_runtime_pp_zero_memory.py):

* **Unsharded gradients, accumulated in the reduce dtype, until the stage's last backward.**
  ``_PipelineStageBase.backward_maybe_with_nosync`` calls ``set_requires_gradient_sync(False)``
  and ``set_reshard_after_backward(False)`` before every micro-batch's backward and reduces
  (``post_backward`` of every FSDP param group) only after the last one (torch
  torch/distributed/pipelining/stage.py: the torch 2.5/2.6 code of torchtitan's Dec 2024 runs;
  torch 2.13 moved it to ``perform_reduce_grad``). With ``reduce_dtype`` unlike ``param_dtype``
  FSDP2 upcasts each unsharded gradient into ``unsharded_accumulated_grad``
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``to_accumulated_grad_if_needed`` /
  ``accumulate_unsharded_grad_if_needed``): torchtitan's ``MixedPrecisionPolicy(bf16,
  float32)`` holds ``grad_reduce_bytes`` (4) per parameter of the stage, whole — not ZeRO-2's
  ``2Ψ/d``. It is charged for the whole backward phase, beside the activations in flight at the
  first backward: exact in the steady state of 1F1B (each backward starts with ``pp − r``
  micro-batches in flight and the gradients of earlier ones whole), one micro-batch's
  activations high on a rank whose micro-batches are all in warm-up (``m ≤ pp − r``).
* **Weights kept gathered, FP8 ones at 1 byte.** ZeRO-2 (torchtitan's ``reshard_after_forward =
  not pp_enabled``) keeps the stage's gathered weights from forward to backward. Under ZeRO-3
  each forward reshards, but the same ``set_reshard_after_backward(False)`` (recursive over the
  stage's FSDP modules) keeps what each backward gathers, so at a backward's end the stage's
  weights are whole beside its whole gradients: charged whole, as ZeRO-2's (the ZeRO-3 gather
  buffer of its two largest rows, ``gathered``, stays as the search's memory program charges it:
  an overcount of those two rows' weights). With torchao's float8 all-gather
  (``WeightWithDynamicFloat8CastTensor.fsdp_post_all_gather`` returns a Float8 tensor over the
  gathered uint8 data) each linear weight is held at 1 byte of 2 (``precision.fp8_weight_share``).

Both are per-row, per-parameter figures: ``row_coefficients`` charges them in ``state_bytes``
(what the search's memory program sums) and ``estimate`` in its per-rank breakdown
(``stage_states``), so the two stay equal.

**The last stage's outputs, every micro-batch's.** torch's stage keeps each forward's output on
the last stage for the step's merged return (``_PipelineStageBase.forward_one_chunk``:
``self.output_chunks.append(output)`` when ``is_last``, cleared by ``clear_runtime_states`` at the
next step; torch 2.6 has no switch, torch 2.13 only ``return_outputs=False``): ``m`` bf16 logits
tensors of ``b·s·vocab/tp`` (vocab shards under loss parallel) for the whole step, charged as
model state on the head row (``held_output_bytes``: a per-row figure once ``m`` is known, which
the search adds where it knows ``m``, ``Costs.terms``, and ``estimate`` on the rank holding it).

Not priced yet (they depend on the stage cut, which the search's per-row memory terms cannot
carry): one receive buffer per micro-batch for a stage's input and output gradient, allocated
for every micro-batch up front (``_prepare_forward_infra`` / ``_prepare_backward_infra``), the
input ones doubling as the saved stage inputs while their micro-batch is in flight. Nor
Mixture-of-Experts tables (their experts are ep shards, ``experts.expert_state_bytes``).
"""
from __future__ import annotations

import functools

import numpy as np

from costmodels.model.dp_sync import grad_bytes
from costmodels.model.experts import expert_arrays
from costmodels.model.memory import STATE_BYTES
from costmodels.model.precision import fp8_weight_share, stack_key


def applies(plan, runtime, precision: str, zero_dp: int) -> bool:
    """Whether the stage is FSDP2 under torch's pipelining: the runtime says so, pp > 1, a ZeRO
    shard group of more than one rank at ZeRO-2/3, the bf16-mixed recipe (the amp / fp32
    recipes of autopar's own runtime carry their own terms: memory._runtime_peak)."""
    return (bool(getattr(runtime, "torch_pipelining", 0)) and plan.pp > 1 and zero_dp > 1
            and plan.zero >= 2 and precision == "bf16-mixed")


def state_bytes_per_param(arr, plan, runtime, precision: str, zero_dp: int,
                          p_b: float, g_b: float) -> tuple[np.ndarray, float]:
    """(weight bytes per parameter of each row, gradient bytes per parameter) on a GPU:
    ZeRO's ``p_b`` / ``g_b`` (``memory.model_state_bytes`` per parameter), or where ``applies``
    the FP8-held weights and the unsharded reduce-dtype gradients of the module docstring."""
    if not applies(plan, runtime, precision, zero_dp) or expert_arrays(arr).any:
        return np.full(arr.n, p_b), g_b
    share = fp8_weight_share(arr, plan, stack_key(runtime), plan.zero)
    return STATE_BYTES[precision][0] * share, grad_bytes(precision, runtime)   # whole, ZeRO-3 too


def stage_states(mem: dict[str, float], arr, chunks: list[tuple[int, int]], plan, runtime,
                 precision: str, zero_dp: int) -> dict[str, float]:
    """``mem`` (one pipeline rank's breakdown from ``memory.stage_memory``) with its weights and
    gradients as ``state_bytes_per_param`` charges them; unchanged where that is ZeRO's."""
    if not applies(plan, runtime, precision, zero_dp) or expert_arrays(arr).any:
        return mem
    rows = np.concatenate([np.arange(s, e) for s, e in chunks])
    params = arr.params[rows] / plan.tp
    p_b, g_b = state_bytes_per_param(arr, plan, runtime, precision, zero_dp,
                                     STATE_BYTES[precision][0], STATE_BYTES[precision][1])
    out = dict(mem)
    out["params"] = float((params * p_b[rows]).sum())
    out["grads"] = g_b * float(params.sum())
    out["total"] = mem["total"] + (out["params"] - mem["params"]) + (out["grads"] - mem["grads"])
    return out


def held_output_bytes(arr, plan, runtime, precision: str, m: int) -> np.ndarray:
    """Per row: the bf16 logits of all ``m`` micro-batches the last pipeline stage keeps for the
    step (module docstring), on the head row; zeros where torch's pipelining is not the runtime's."""
    from costmodels.model.memory import logits
    if not (getattr(runtime, "torch_pipelining", 0) and plan.pp > 1 and precision == "bf16-mixed"):
        return np.zeros(arr.n)
    return _head_rows(arr) * m * arr.table.act_dtype_bytes * logits(arr, plan.micro_batch_size) / plan.tp


@functools.lru_cache(maxsize=64)
def _head_rows(arr) -> np.ndarray:
    """1.0 on the head row(s) of ``arr`` (the search asks once per configuration)."""
    return np.array([r.kind == "head" for r in arr.table.rows], dtype=float)


def with_held_outputs(mem: dict, arr, chunks: list[tuple[int, int]], plan, runtime, precision: str,
                      m: int) -> dict:
    """``mem`` (one pipeline rank's breakdown) with the held outputs of the rows of its ``chunks``
    charged as activations (``held_output_bytes``)."""
    held = held_output_bytes(arr, plan, runtime, precision, m)
    add = float(sum(held[s:e].sum() for s, e in chunks))
    if add == 0.0:
        return mem
    return {**mem, "activations": mem["activations"] + add, "total": mem["total"] + add}
