"""What torch's tensor parallelism with sequence parallelism saves that Megatron's does not: the
gathered input of each column-parallel projection, whole.

Megatron's sequence parallelism (Korthikanti et al. 2022 §4.2.2; ``memory.activation_bytes``:
``T/t + R/t``) saves the sequence-sharded input of a column-parallel linear and all-gathers it
again in the backward. torch's DTensor TP (torchtitan's ``apply_tp``: ``PrepareModuleInput(
input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))`` on ``attention`` and
on ``feed_forward``, ``ColwiseParallel(input_layouts=Shard(1))`` on ``output``; pytorch/torchtitan
9dec370 torchtitan/parallelisms/parallelize_llama.py) all-gathers the norm's output in the forward
(``redistribute`` to ``Replicate``) and the linears save that replicated tensor for their weight
gradients (``F.linear``'s autograd keeps its input): a block keeps two ``b·s·h`` tensors whole —
the attention input that wq / wk / wv share and the MLP input that w1 / w3 share — where the
model counted ``1/t`` of each, and the head keeps the final norm's output whole. The runtime
profile's ``[memory] tp_saves_gathered_inputs = 1`` says the runtime does this (fsdp.toml).

Per micro-batch, per row, at tp > 1 with sequence parallelism: ``n · input · (1 − 1/t)`` more,
``n`` = 2 on a block row (0 under full recompute, which keeps only the block's input), 1 on the
head row. Full recompute re-runs a block's forward before its backward, so its working set (the
largest block's ``act_none_bytes``) holds the two gathered inputs too. The figures are per row
and per micro-batch, so the search's memory rows (``row_coefficients``) carry them as
``estimate`` does. Not for Mixture-of-Experts tables (their MLP input is dispatched, not gathered).
"""
from __future__ import annotations

import numpy as np

from costmodels.model.experts import expert_arrays
from costmodels.model.table_arrays import TableArrays


def applies(arr: TableArrays, plan, runtime, precision: str) -> bool:
    return (bool(getattr(runtime, "tp_saves_gathered_inputs", 0)) and plan.tp > 1
            and bool(plan.sequence_parallel) and precision == "bf16-mixed" and not expert_arrays(arr).any)


def _gathered(arr: TableArrays, plan) -> np.ndarray:
    """One gathered ``b·s·h`` input per row, less the ``1/t`` the model already counts."""
    inputs = np.concatenate(([arr.boundary[0]], arr.boundary[:-1]))   # as memory._inputs
    k = plan.micro_batch_size / arr.table.micro_batch
    return k * inputs * (1.0 - 1.0 / plan.tp)


def saved_bytes(arr: TableArrays, plan, runtime, precision: str) -> np.ndarray:
    """Per row and micro-batch in flight: the gathered inputs kept beyond the model's ``1/t``."""
    if not applies(arr, plan, runtime, precision):
        return np.zeros(arr.n)
    head = np.array([r.kind == "head" for r in arr.table.rows])
    n = np.where(arr.is_block, 0.0 if plan.recompute == "full" else 2.0, 0.0) + head
    return n * _gathered(arr, plan)


def working_bytes(arr: TableArrays, plan, runtime, precision: str) -> np.ndarray:
    """Per block row: what its recompute holds beyond ``activation_bytes_none`` (both inputs)."""
    if not applies(arr, plan, runtime, precision):
        return np.zeros(arr.n)
    return np.where(arr.is_block, 2.0, 0.0) * _gathered(arr, plan)


def with_working_set(mem: dict, arr: TableArrays, chunks, plan, runtime, precision: str,
                     work_rows: np.ndarray) -> dict:
    """``mem`` (``memory.stage_memory``'s breakdown) with full recompute's working set read off
    ``work_rows`` (``RowCoefficients.act_none_bytes``, the gathered inputs included) as the search
    reads it, where ``stage_memory`` charged the block's saved bytes without them."""
    if plan.recompute != "full" or not applies(arr, plan, runtime, precision):
        return mem
    extra = working_bytes(arr, plan, runtime, precision)
    blocks = [np.asarray(work_rows[s:e])[arr.is_block[s:e]] for s, e in chunks]
    with_inputs = max((float(b.max()) for b in blocks if b.size), default=0.0)
    without = max((float((np.asarray(work_rows[s:e]) - extra[s:e])[arr.is_block[s:e]].max())
                   for s, e in chunks if arr.is_block[s:e].any()), default=0.0)
    add = max(0.0, with_inputs - without)
    return {**mem, "activations": mem["activations"] + add, "total": mem["total"] + add}
