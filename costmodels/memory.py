"""Memory model: bytes on one GPU, split into params, grads, optimizer, activations, reserve.

Model states (bf16 mixed precision with fp32 master weights and Adam, as ZeRO Table 1 counts
them: 2 + 2 + 12 bytes per parameter), for ``Ψ`` parameters on this GPU after tensor and
pipeline sharding (``Ψ = Σ_rows params / t`` over the rows of its pipeline stages) and data
parallel degree ``d``::

    ZeRO 0:  params 2Ψ      grads 2Ψ      optimizer 12Ψ
    ZeRO 1:  params 2Ψ      grads 2Ψ      optimizer 12Ψ/d
    ZeRO 2:  params 2Ψ      grads 2Ψ/d    optimizer 12Ψ/d
    ZeRO 3:  params 2Ψ/d    grads 2Ψ/d    optimizer 12Ψ/d   (+ gather buffer, below)

ZeRO-3 also holds the gathered bf16 weights of the row (layer) being computed and of the one
being prefetched (FSDP-style per-layer gathers): ``2·(largest two rows' params)/t`` more under
``params`` in ``estimate``
(not in ``model_state_bytes``, which is exactly ZeRO's Table 1).

Activations saved per micro-batch, per row, per GPU (Korthikanti et al. 2022, Table 2, with
the table's categories; ``k = b/b0`` scales the traced micro-batch ``b0`` to the plan's ``b``)::

    attention core  C = act_attention_core_bytes (0 with flash attention: never materialised)
    TP part         T = act_tp_bytes − (C if flash or selective else 0)
    replicated      R = saved_activation_bytes − act_tp_bytes
    recompute none / selective:   k·( T/t + R/(t if sp else 1) )      (selective drops C)
    recompute full, block rows:   k·boundary_bytes_{i-1}/(t if sp else 1)   (the layer input only;
                                  embedding / head rows are not checkpointed and keep the above)

For GPT-3 175B (math attention) this is s·b·h·(34 + 5as/h) with no parallelism, s·b·h·(10 +
24/t + 5as/(ht)) with TP, s·b·h·(34/t + 5as/(ht)) with TP+SP, the same without the 5as/h term
with selective recompute, and 2·s·b·h with full recompute, as in the paper's Table 2.

Full recompute also needs one block's full activations while it is being recomputed (a working
set of ``max_i A_none,i`` over the stage's block rows) — added once per GPU.

Micro-batches in flight on pipeline rank r (0-based) of p, m micro-batches (``in_flight``):

    gpipe              every micro-batch of every chunk: m
    1f1b               min(p − r, m)
    interleaved-1f1b   Megatron's warm-up: N_r = min((p − r − 1)·2 + (v − 1)·p + 1, m·v)
                       forward chunk-passes, issued p at a time to chunk 0, 1, …, v−1, 0, …
                       (so rank 0 holds L·(1 + (p−1)/(p·v)) layers' worth, as Korthikanti
                       et al. §4.2.3 state)

Activation bytes of rank r = Σ over its chunks c of in_flight_c · Σ_{rows of c} A_i (+ the full
recompute working set). Reserve = the profile's ``memory_reserve_bytes``. Total = sum; the plan
fits when the most loaded GPU's total ≤ ``hbm_bytes``.
"""
from __future__ import annotations

import numpy as np

from costmodels.compute import TableArrays, activation_bytes_none

BYTES_PARAM = 2.0      # bf16 weights
BYTES_GRAD = 2.0       # bf16 gradients
BYTES_OPTIMIZER = 12.0  # fp32 master weights + Adam m and v


def model_state_bytes(params: float, dp: int, zero: int) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for ``params`` parameters held by this GPU's
    model-parallel shard, data parallel degree ``dp`` and ZeRO stage ``zero`` (ZeRO Table 1)."""
    p, g, o = BYTES_PARAM * params, BYTES_GRAD * params, BYTES_OPTIMIZER * params
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        p /= dp
    return p, g, o


def activation_bytes(arr: TableArrays, tp: int, sp: bool, b: int, recompute: str,
                     attention: str) -> np.ndarray:
    """Bytes saved for backward per micro-batch, per row, on one GPU (formula in the docstring)."""
    if recompute == "none":
        return activation_bytes_none(arr, tp, sp, b, attention)
    if recompute == "selective":  # the attention core is recomputed: what flash never saves
        return activation_bytes_none(arr, tp, sp, b, "flash")
    k = b / arr.table.micro_batch
    # full: block rows keep their input (the previous row's output)
    base = activation_bytes_none(arr, tp, sp, b, attention)
    inputs = np.concatenate(([arr.boundary[0]], arr.boundary[:-1]))
    kept = k * inputs / (tp if sp else 1)
    return np.where(arr.is_block, kept, base)


def recompute_working_bytes(arr: TableArrays, tp: int, sp: bool, b: int, recompute: str,
                            attention: str, rows: list[tuple[int, int]]) -> float:
    """Extra bytes full recompute needs while one block is recomputed (0 otherwise)."""
    if recompute != "full":
        return 0.0
    a = activation_bytes_none(arr, tp, sp, b, attention)
    best = 0.0
    for s, e in rows:
        blk = a[s:e][arr.is_block[s:e]]
        if blk.size:
            best = max(best, float(blk.max()))
    return best


def in_flight(schedule: str, pp: int, vpp: int, m: int, rank: int) -> list[int]:
    """Micro-batches whose activations chunk c (c = 0..vpp-1) of pipeline rank ``rank`` holds
    at its peak, per the schedule (see the module docstring)."""
    if schedule == "gpipe":
        return [m] * vpp
    if schedule == "1f1b" or vpp == 1:
        return [min(pp - rank, m)] * vpp
    n = min((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    counts = [0] * vpp
    for i in range(n):
        counts[(i // pp) % vpp] += 1
    return counts


def stage_memory(arr: TableArrays, chunks: list[tuple[int, int]], *, tp: int, dp: int, zero: int,
                 sp: bool, b: int, recompute: str, attention: str, inflight: list[int],
                 reserve: float, act_rows: np.ndarray | None = None) -> dict[str, float]:
    """Memory breakdown of one GPU whose pipeline rank runs ``chunks`` (row ranges, one per
    virtual stage) with ``inflight[c]`` micro-batches of chunk c in flight."""
    params = sum(float(arr.params[s:e].sum()) for s, e in chunks) / tp
    p, g, o = model_state_bytes(params, dp, zero)
    if zero >= 3:
        sizes = np.sort(np.concatenate([arr.params[s:e] for s, e in chunks]))[::-1]
        p += BYTES_PARAM * float(sizes[:2].sum()) / tp
    if act_rows is None:
        act_rows = activation_bytes(arr, tp, sp, b, recompute, attention)
    act = sum(n * float(act_rows[s:e].sum()) for (s, e), n in zip(chunks, inflight))
    act += recompute_working_bytes(arr, tp, sp, b, recompute, attention, chunks)
    total = p + g + o + act + reserve
    return {"params": p, "grads": g, "optimizer": o, "activations": act, "reserve": reserve,
            "total": total}
