"""Memory model: bytes on one GPU, split into params, grads, optimizer, activations, reserve.

**Precision** (``precision=``, default ``"bf16-mixed"``) says what the training loop keeps:

* ``"bf16-mixed"`` — Megatron / DeepSpeed: bf16 weights and gradients, fp32 master weights and
  Adam moments, loss in a fused vocab-parallel cross-entropy. The model's published figures
  (ZeRO Table 1, Korthikanti Table 2) are in this recipe; the search uses it.
* ``"amp"`` — autopar's own runtime under ``torch.autocast(bfloat16)`` (what ``autopar validate``
  runs): fp32 parameters and gradients, AdamW's two fp32 moments, bf16 matmuls whose weight
  casts autocast caches for the whole step, an unfused ``F.cross_entropy(logits.float())``.
* ``"fp32"`` — the same runtime without autocast (``autopar validate --fp32``).

Model states for ``Ψ`` parameters on this GPU after tensor and pipeline sharding
(``Ψ = Σ_rows params / t`` over the rows of its pipeline stages), data parallel degree ``d``,
with ``(P, G, O)`` bytes per parameter = (2, 2, 12) for bf16-mixed (ZeRO Table 1) and (4, 4, 8)
for amp and fp32 (``STATE_BYTES``)::

    ZeRO 0:  params PΨ      grads GΨ      optimizer OΨ
    ZeRO 1:  params PΨ      grads GΨ      optimizer OΨ/d
    ZeRO 2:  params PΨ      grads GΨ/d    optimizer OΨ/d
    ZeRO 3:  params PΨ/d    grads GΨ/d    optimizer OΨ/d   (+ gather buffer, below)

ZeRO-3 also holds the gathered weights of the row (layer) being computed and of the one being
prefetched (FSDP-style per-layer gathers): ``P·(largest two rows' params)/t``, reported as their
own term ``gathered`` (``params`` stays the sharded states, exactly ZeRO's Table 1).

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

**The loss** (head row, ``L = b·s·vocab`` logits per micro-batch; not in the traced table,
which stops at the logits). bf16-mixed: the fp32 logits Megatron's vocab-parallel cross-entropy
keeps for backward, ``4·L/t`` (Korthikanti §4.1). amp / fp32: ``F.cross_entropy`` saves its
fp32 log-softmax, ``4·L`` — full vocab on every TP rank, because autopar's TP head all-gathers
the logits (rewrite contract).

**Precision corrections to the traced (bf16, no autocast) table**, amp: autocast runs layer norms
in fp32 and adds bf16 branch outputs to an fp32 residual stream (the embedding is not autocast),
so every norm saves an fp32 input where the table counted bf16: ``+boundary_bytes_{i-1}`` per
norm — two per (pre-norm) block, one on the head (its final norm) — scaled like ``R``; under full
recompute the kept block input is that fp32 stream (×2). fp32: every activation is fp32,
``×4/act_dtype_bytes``.

**Runtime terms, amp / fp32 only** (autopar's runtime; Megatron has none of them), per GPU:

* autocast's weight cache: ``2`` bytes per parameter of the block and head rows (their matmul
  weights; the norms' are < 0.5%), the full weights even under ZeRO-2/3, for the whole step;
* ZeRO 0/1 with dp > 1: DDP's gradient buckets, ``GΨ`` (a second copy of the gradients; none
  when an interleaved schedule syncs after the step). ZeRO 2/3 run FSDP2: ZeRO-2 holds the shards
  (``PΨ/d``) and every gathered weight from forward to backward (``PΨ``); ZeRO-3's gathered rows
  are not live at a backward's start (FSDP2 re-gathers a row in its pre-backward hook, after the
  loss backward). With several micro-batches at pp = 1 FSDP2 accumulates *unsharded* gradients
  (``GΨ``: ``run_local`` syncs on the last micro-batch only); under pp > 1 autopar's stage
  (``autopar.runtime.step.pipeline_stage``) reduce-scatters every micro-batch's gradients into
  the shards and ZeRO-3 reshards after each backward, so the gradients stay sharded and ZeRO-3's
  gathered rows are two, as at pp = 1 (measured: tests/test_runtime_pp_zero_memory.py);
* pp > 1: ``torch.distributed.pipelining``'s receive buffers, one per micro-batch for every
  input (chunk start > 0) and output-gradient (chunk end < rows) of the rank's chunks:
  ``m·k·boundary·4/act_dtype_bytes`` each (the fp32 residual stream), ``/t`` with sp;
* the logits the step holds: each micro-batch's output until its backward — one at pp = 1, the
  head chunk's micro-batches in flight under pp > 1 (autopar runs torch's schedule with
  ``return_outputs=False``, so the last stage keeps none for the step's end), ``L·(2 amp | 4
  fp32)`` each;
* the loss backward's transient: the gradients of the log-probabilities and of the fp32 logits
  (``8·L``), live together with the saved log-softmax, at the start of each backward;
* the optimizer step (foreach AdamW, GPUs' default): one fp32 temporary per optimizer tensor;
* pp > 1 (``pipeline_backward_memory``): every micro-batch in flight holds its own bf16 weight
  casts (amp), and at ZeRO-2/3 a later backward's reduce holds two rows' whole gradients
  (FSDP2's reduce window) beside ZeRO-3's two gathered rows: a fifth moment;
* (not held: autocast's bf16 weight gradients. autopar's runtime casts the weights anew for
  every micro-batch (autopar/runtime/step/schedules.py ``fresh_autocast_casts``); with one cast
  per step a backward after the first would hold all of them to its end, the engine running
  micro-batch 1's cast nodes last — measured, tests/test_memory_autocast_grads.py.)

The peak of an amp / fp32 step is the largest of four moments: the first backward's start
(in-flight activations + loss transient + held logits, no gradients yet), a later backward's
start (``inflight_later`` micro-batches in flight and the gradients of the earlier ones; with
one micro-batch there is none), the end of backward (all gradients, no activations) and the
optimizer step (autocast's cache and the gathered weights released). On the validate plans of
a 4-layer GPT at vocab 8192 the first two win: the loss terms are the largest activations.

Full recompute also needs one block's full activations while it is being recomputed (a working
set of ``max_i A_none,i`` over the stage's block rows) — added once per GPU.

Micro-batches in flight on pipeline rank r (0-based) of p, m micro-batches (``in_flight``):

    gpipe              every micro-batch of every chunk: m
    1f1b               min(p − r, m)
    interleaved-1f1b   Megatron's warm-up: N_r = min((p − r − 1)·2 + (v − 1)·p + 1, m·v)
                       forward chunk-passes, issued p at a time to chunk 0, 1, …, v−1, 0, …
                       (so rank 0 holds L·(1 + (p−1)/(p·v)) layers' worth, as Korthikanti
                       et al. §4.2.3 state)

    interleaved-zb, zb-v, dualpipe-v   read off the simulated order (``split_in_flight``): a
                       micro-batch holds its activations from its forward to the end of its W
                       (torch's B pass keeps the autograd graph for W), and between B and W also
                       the output gradients W needs (``w_input_bytes``: the weighted products'
                       outputs, ``bwd_weight_flops / (2·hidden)`` elements per row — exact for
                       products whose inner size is the hidden size, 4× high for the MLP's down
                       projection); the rank's peak is the moment (right after a forward) where
                       the bytes held are most. At the peak rank r holds, uniform stages:
                       interleaved-zb p micro-batches of every chunk (p·v, every rank: W lags
                       B by r steps); zb-v 2p (2p − 1 − r of chunk 0 and r + 1 of chunk 1, or
                       2p − r and r): the V balances ranks, each holding p·(layers/p) like
                       1F1B's rank 0; dualpipe-v 2p + 1 (2p − r and r + 1). The moments repeat
                       after three periods (``schedule_program.period``), so the order is
                       counted up to min(m, 3 periods).

Activation bytes of rank r = Σ over its chunks c of in_flight_c · Σ_{rows of c} A_i (+ the full
recompute working set, + the W inputs held). Reserve = the profile's ``memory_reserve_bytes``. Total = sum; the plan
fits when the most loaded GPU's total ≤ ``hbm_bytes``.
"""
from __future__ import annotations

import numpy as np

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES
from costmodels.model import pipeline_backward_memory as pbm
from costmodels.model.compute import RUNTIME_PRECISIONS
from costmodels.model.schedule_program import in_flight_states, period
from costmodels.model.table_arrays import TableArrays, activation_bytes_none

PRECISIONS = ("bf16-mixed", "amp", "fp32")
# bytes per parameter: (weights, gradients, optimizer state)
STATE_BYTES = {"bf16-mixed": (2.0, 2.0, 12.0),   # bf16 weights/grads; fp32 master + Adam m, v
               "amp": (4.0, 4.0, 8.0),            # fp32 weights/grads; AdamW m, v
               "fp32": (4.0, 4.0, 8.0)}
BYTES_PARAM = STATE_BYTES["bf16-mixed"][0]   # the search's recipe (Megatron bf16 weights)
AUTOCAST_CACHE_BYTES = 2.0   # autocast's cached bf16 copy of each matmul weight
LOSS_SAVED_BYTES = 4.0       # fp32 per logit kept by the loss for backward (docstring)
LOSS_GRAD_BYTES = 8.0        # fp32 grads of log-probs and of logits, loss backward (amp / fp32)
LOGIT_BYTES = {"amp": 2.0, "fp32": 4.0}   # the head's output dtype


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise PlanError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def model_state_bytes(params: float, dp: int, zero: int,
                      precision: str = "bf16-mixed") -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for ``params`` parameters held by this GPU's
    model-parallel shard, data parallel degree ``dp`` and ZeRO stage ``zero`` (ZeRO Table 1,
    with ``STATE_BYTES[precision]`` per parameter)."""
    bp, bg, bo = STATE_BYTES[check_precision(precision)]
    p, g, o = bp * params, bg * params, bo * params
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        p /= dp
    return p, g, o


def logits(arr: TableArrays, b: int) -> np.ndarray:
    """Logits the loss reads per row and micro-batch of ``b`` sequences (b·s·vocab on the head)."""
    return arr.loss_logits / arr.table.micro_batch * b    # exact: whole numbers below 2**53


def activation_bytes(arr: TableArrays, tp: int, sp: bool, b: int, recompute: str,
                     attention: str, precision: str = "bf16-mixed",
                     loss_bytes: float | None = None) -> np.ndarray:
    """Bytes saved for backward per micro-batch, per row, on one GPU (formula in the docstring),
    the loss's saved logits included on the head row: ``loss_bytes`` per logit (the runtime's
    loss kernel, e.g. 2 for a fused cross-entropy that keeps the bf16 gradient in the logits'
    buffer; None: ``LOSS_SAVED_BYTES``)."""
    check_precision(precision)
    k = b / arr.table.micro_batch
    if recompute in ("none", "selective"):  # selective: drop the core, as flash never saves it
        out = activation_bytes_none(arr, tp, sp, b, attention,
                                    drop_core=recompute == "selective" or attention == "flash")
    else:   # full: block rows keep their input (the previous row's output)
        base = activation_bytes_none(arr, tp, sp, b, attention)
        out = np.where(arr.is_block, k * _inputs(arr) / (tp if sp else 1), base)
    if precision == "amp":
        norms = np.where(arr.is_block, 1.0 if recompute == "full" else 2.0, 0.0)
        norms += np.array([1.0 if r.kind == "head" else 0.0 for r in arr.table.rows])
        out = out + norms * k * _inputs(arr) / (tp if sp else 1)
    elif precision == "fp32":
        out = out * 4.0 / arr.table.act_dtype_bytes
    shard = 1 if precision in RUNTIME_PRECISIONS else tp   # autopar gathers the logits on every rank
    per_logit = LOSS_SAVED_BYTES if loss_bytes is None else loss_bytes
    return out + per_logit * logits(arr, b) / shard


def _inputs(arr: TableArrays) -> np.ndarray:
    return np.concatenate(([arr.boundary[0]], arr.boundary[:-1]))


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


def w_input_bytes(arr: TableArrays, tp: int, b: int) -> np.ndarray:
    """Per row and micro-batch, the output gradients a deferred weight-gradient pass needs (held
    from the micro-batch's B to its W): ``bwd_weight_flops / (2·hidden)`` elements (each weighted
    product's output, module docstring), sharded by tp like the TP regions."""
    h = float(arr.table.hidden or 0)
    if not h:
        return np.zeros(arr.n)
    k = b / arr.table.micro_batch
    return k * arr.wgt_flops / (2.0 * h) * arr.table.act_dtype_bytes / tp


def split_in_flight(schedule: str, pp: int, vpp: int, m: int, rank: int, chunk_act: list[float],
                    chunk_w: list[float]) -> tuple[list[int], float]:
    """(micro-batches whose activations chunk c of ``rank`` holds, bytes of W inputs held) at
    the rank's peak under a split-backward schedule, ``chunk_act[c]`` / ``chunk_w[c]`` the bytes
    of one micro-batch's activations / W inputs of chunk c (module docstring)."""
    if schedule not in SPLIT_BACKWARD_SCHEDULES:
        raise PlanError(f"schedule '{schedule}' does not split the backward")
    per = period(schedule, pp, m)
    states = in_flight_states(schedule, pp, vpp, min(m, 3 * per))[rank]

    def held(state):
        return sum(n * a + w * x for (n, w), a, x in zip(state, chunk_act, chunk_w))

    best = max(states, key=held)
    return [n for n, _ in best], sum(w * x for (_, w), x in zip(best, chunk_w))


def stage_memory(arr: TableArrays, chunks: list[tuple[int, int]], *, tp: int, dp: int, zero: int,
                 sp: bool, b: int, recompute: str, attention: str, inflight: list[int],
                 reserve: float, act_rows: np.ndarray | None = None, precision: str = "bf16-mixed",
                 m: int = 1, pp: int = 1, vpp: int = 1,
                 inflight_later: list[int] | None = None, w_inputs: float = 0.0,
                 ep: int = 1) -> dict[str, float]:
    """Memory breakdown of one GPU whose pipeline rank runs ``chunks`` (row ranges, one per
    virtual stage) with ``inflight[c]`` micro-batches of chunk c in flight at its first backward.
    amp / fp32 only: ``m`` micro-batches per step, ``pp``/``vpp`` the plan's, and
    ``inflight_later[c]`` in flight at a later backward (``in_flight(..., m - 1, rank)``);
    ``w_inputs`` the bytes held for deferred weight-gradient passes (``split_in_flight``);
    ``ep`` the plan's, for the routed experts autopar's runtime keeps whole (``_runtime_peak``)."""
    sizes = np.concatenate([arr.params[s:e] for s, e in chunks])
    params = float(sizes.sum()) / tp
    p, g, o = model_state_bytes(params, dp, zero, precision)
    gather = 0.0
    if zero >= 3:
        gather = STATE_BYTES[precision][0] * float(np.sort(sizes)[::-1][:2].sum()) / tp
    if act_rows is None:
        act_rows = activation_bytes(arr, tp, sp, b, recompute, attention, precision)
    work = recompute_working_bytes(arr, tp, sp, b, recompute, attention, chunks)
    act = work + w_inputs + sum(n * float(act_rows[s:e].sum()) for (s, e), n in zip(chunks, inflight))
    if precision in RUNTIME_PRECISIONS:
        later = None
        if m > 1:
            later = work + w_inputs + sum(n * float(act_rows[s:e].sum())
                               for (s, e), n in zip(chunks, inflight_later or inflight))
        head = [n for (s, e), n in zip(chunks, inflight)
                if any(r.kind == "head" for r in arr.table.rows[s:e])]
        p, g, act, gather = _runtime_peak(arr, chunks, params, p, g, act, later, gather, tp=tp,
                                          dp=dp, zero=zero, sp=sp, b=b, precision=precision, m=m,
                                          pp=pp, vpp=vpp, head_inflight=head[0] if head else 1,
                                          inflight=inflight, inflight_later=inflight_later or inflight,
                                          act_rows=act_rows, ep=ep)   # pipeline_backward_memory.py
    total = (p + gather) + g + o + act + reserve
    return {"params": p, "grads": g, "optimizer": o, "gathered": gather, "activations": act,
            "reserve": reserve, "total": total}


def _runtime_peak(arr, chunks, params, p, g, act, later, gather, *, tp, dp, zero, sp, b,
                  precision, m, pp, vpp, head_inflight=1, inflight=None, inflight_later=None,
                  act_rows=None, ep=1):
    """(params, grads, activations, gathered) at the peak of autopar's runtime step (the amp / fp32 terms
    of the module docstring): the first backward (no gradients yet), a later one (``later``
    activations in flight, the gradients of earlier micro-batches), the end of the last one (all
    gradients, no activations) or the optimizer step, whichever holds most. ZeRO-3's gathered
    rows (``gather``) are not live at a backward's start: FSDP2 re-gathers a unit in its
    pre-backward hook, after the loss backward that makes that moment's peak."""
    bp, bg, _ = STATE_BYTES[precision]
    rows = [i for s, e in chunks for i in range(s, e)]
    kinds = [arr.table.rows[i].kind for i in rows]
    p_rest, g_rest = p, g
    # routed experts (issue 27): autocast caches no cast of theirs (autopar runs each expert on
    # a slice w[e] of the stacked weights, a view, and autocast caches leaf tensors only), and
    # DDP's buckets leave them out (autopar/runtime/step/data_parallel.py ignores the expert shards)
    # where it shards them (ep > 1 or tp > 1: autopar/runtime/apply.py; else they are plain parameters)
    experts = sum(float(getattr(arr.table.rows[i], "expert_params", 0) or 0) for i in rows) / tp
    cached = sum(float(arr.params[i]) for i, kd in zip(rows, kinds) if kd in ("block", "head")) / tp - experts
    whole = experts if (ep > 1 or tp > 1) else 0.0
    if precision == "amp":   # autocast's cached bf16 weights, full even when ZeRO shards them
        p += AUTOCAST_CACHE_BYTES * cached
    buckets = recv = 0.0
    if dp > 1 and zero < 2 and not (pp > 1 and vpp > 1):
        buckets = bg * (params - whole)       # DDP's gradient buckets
    if dp > 1 and zero == 2:                  # FSDP2: the shards at rest, and the gathered
        p_rest = bp * params / dp             # weights kept from forward through backward
        p += p_rest
    if dp > 1 and zero >= 2 and m > 1 and pp == 1:
        g = bg * params                       # unsharded gradients accumulate between syncs
    if pp > 1:   # pipelining's receive buffers, one per micro-batch: fp32 residual stream
        k = m * b / arr.table.micro_batch * 4.0 / arr.table.act_dtype_bytes / (tp if sp else 1)
        n = len(arr.table.rows)
        recv = k * sum(float(arr.boundary[s - 1]) * (s > 0) + float(arr.boundary[e - 1]) * (e < n)
                       for s, e in chunks)
    held = transient = 0.0
    if "head" in kinds:
        lg = float(logits(arr, b).sum())
        held = (head_inflight if pp > 1 else 1) * LOGIT_BYTES[precision] * lg   # until each backward
        transient = LOSS_GRAD_BYTES * lg
    kept = 0.0 if pp > 1 else held   # return_outputs=False: no output outlives its backward
    # foreach AdamW: one fp32 temporary per optimizer tensor (sqrt of v) during the step
    # (the routed experts' part: the rank's ep shard, whole on every rank, which steps it itself)
    t_opt = 4.0 * (params - whole) / (dp if zero >= 1 else 1) + 4.0 * whole * tp / ep
    # (params, grads, activations, gathered) at each moment
    # under pp: each micro-batch in flight holds its own casts (pipeline_backward_memory.py)
    casts_first = pbm.cast_copies_bytes(arr, chunks, inflight, tp, precision, pp)
    casts_later = pbm.cast_copies_bytes(arr, chunks, inflight_later, tp, precision, pp)
    moments = [(p + casts_first, buckets, act + transient + held + recv, 0.0),   # first backward
               (p, buckets + g, kept + recv, gather),                         # end of backward
               (p_rest, buckets + g_rest + t_opt, recv, 0.0)]                  # optimizer
    if later is not None:
        moments.append((p + casts_later, buckets + g, later + transient + held + recv, 0.0))   # a later backward
    reduce_at = None if act_rows is None else pbm.moment(
        arr, chunks, inflight_later, act_rows, tp=tp, dp=dp, zero=zero, pp=pp, precision=precision,
        grad_bytes=bg, held_per_micro_batch=held / max(head_inflight, 1) if pp > 1 else 0.0,
        head_in_flight=head_inflight)
    if reduce_at is not None:   # a later backward's reduce-scatter (pipeline_backward_memory.py)
        casts, window, others = reduce_at
        moments.append((p + casts, buckets + g + window, others + recv, gather))
    return max(moments, key=lambda t: (t[0] + t[3]) + t[1] + t[2])
