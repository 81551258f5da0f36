"""Compute model: time of each layer-table row on one GPU, forward, backward and recompute.

Notation: row i of a table traced at micro-batch ``b0``; the plan runs micro-batch ``b``
(``k = b / b0``; FLOPs and bytes are linear in the micro-batch), tensor-parallel degree ``t``,
sequence parallel ``sp``. ``P`` = the profile's dense peak for the activation dtype
(``peak_bf16_flops_per_s`` for 2-byte activations), ``W`` = HBM bandwidth, ``eff(f)`` = the
profile's matmul-efficiency curve (fraction of peak a single matmul of ``f`` FLOPs reaches).

Two-class roofline per row (matmuls are compute-bound, everything else memory-bound; they are
separate kernels, so their times add)::

    eff_i      = sum_j f_ij / sum_j (f_ij / eff(f_ij))    f_ij = 2·m·n·k·k_b / t for the row's
                                                           matmuls (matmul_dims); a row without
                                                           matmul_dims counts as one matmul
    fwd_i      = k·fwd_flops_i / (t · P · eff_i)  +  C_FWD · A_i / W
    bwd_i      = k·bwd_flops_i / (t · P · eff_i)  +  C_BWD · A_i / W
    bwd_w_i    = k·bwd_weight_flops_i / (t · P · eff_i)      (the W part of bwd_i: weight-gradient
                 matmuls only; the element-wise traffic, loss, attention core and TP collectives
                 of the backward are the input-gradient pass, B = bwd_i − bwd_w_i)

``A_i`` is the row's saved-activation bytes per GPU without recompute (memory.activation_bytes
with recompute "none": TP regions / t, the rest / t with sp, attention core dropped for flash),
a proxy for the traffic of the element-wise kernels (layer norm, GeLU, softmax, dropout,
residual adds): ``C_FWD = 3`` bytes moved per saved byte in the forward and ``C_BWD = 2·C_FWD``
in the backward. C_FWD is FITTED (with the A100 efficiency-curve scale) on two rows of
Korthikanti et al. Table 5 (costmodels.calibration.validation: 22B and 1T, selective + SP); it absorbs
unfused kernels and below-peak achieved HBM bandwidth. Counting bytes kernel by kernel gives
about 1.4 per saved byte at full bandwidth, so the fit says the element-wise part runs at
roughly half the datasheet bandwidth in Megatron-LM. All FLOPs are divided by t (Megatron shards every
matmul, the vocab-parallel head included; layer norms are negligible).

Measured rates (``autopar profile`` writes them; a profile without them uses the defaults):
``W`` for the element-wise traffic is the profile's ``elementwise_bandwidth_bytes_per_s``
(default: HBM bandwidth) — on a CPU, layer norm, GeLU or softmax run well below copy bandwidth;
with flash attention and a measured ``attention_efficiency`` ``a``, the attention core's
``4·b·s²·h/t`` forward FLOPs run at ``P·a`` instead of the row's matmul efficiency, and its
backward takes ``FLASH_BWD_RATIO = 2.5`` times the forward's time (the kernel recomputes the
scores: 5 matmuls against 2, FlashAttention-2's Algorithm 2), where the counted FLOPs (which
MFU uses) say 2.

Loss (head row, models with a vocabulary), per GPU and micro-batch: ``L = b·s·V/t`` logits with
Megatron's vocab-parallel cross-entropy (``precision="bf16-mixed"``, what the search plans), or
``L = b·s·V`` in autopar's runtime ("amp" / "fp32"), which hands the user's loss function whole
logits: every TP rank computes the full-vocabulary loss after an all-gather of the
vocab-parallel logits (forward TP time of the head row: ``b·s·V·dtype`` bytes, plus the ``cat``
that joins the pieces, one more read and write at HBM bandwidth). The loss is memory-bound:
cast to fp32 (read 2 + write 4 bytes per logit), log-softmax (max, sum-exp and write passes:
16), then backward: the one-hot gradient (4), log-softmax backward (12) and the cast back (6):
``LOSS_BYTES_PER_LOGIT = 44`` per logit, half forward, half backward, at ``W`` — or, when the
profile measured it, ``L / rate(L)`` from its ``[gpu.cross_entropy]`` curve (on a CPU exp and
log make it compute-bound, ~3x slower once the logits leave the caches).

Recompute (per micro-batch, block rows only):
    none        0
    full        fwd_i (the whole block forward again, TP collectives included, see comm)
    selective   attention core again (Korthikanti et al. 2022 §4.2): 4·b·s²·h / t FLOPs
                (Q·Kᵀ and scores·V) at eff(that size), plus C_FWD · core_i·k / t / W for the
                softmax / dropout bytes. With flash attention nothing is stored to drop, so
                selective recompute costs 0 (flash already recomputes inside its backward).

Tensor-parallel collectives per row and micro-batch (Megatron f/g operators): ``n_i`` per
direction = number of TP pairs in the row (or 1 when the row has ``tp_comm_bytes`` but no pairs,
e.g. a vocab-parallel embedding), each of ``k·tp_comm_bytes_i`` bytes: ring all-reduce, or with
sequence parallel an all-gather + reduce-scatter (same bytes, twice the steps). They sit on the
critical path (not overlapped). Full recompute repeats the forward ones. With sequence parallel
each parameter tensor TP leaves whole (``tp_replicated_tensors``: norms, row-parallel biases)
sees only its rank's part of the sequence, so its gradient is all-reduced: in autopar's runtime
once per tensor and micro-batch in the backward (4·h bytes each: latency-bound); Megatron
buckets them once per step (neglected).

Host (``host_block_s``, the runtime profile's ``[host] seconds_per_block_pass``; GPU profiles
only, ``host_block_floor``): an eager runtime's host (Python, autograd, hooks, launches) needs
about a fixed time to issue one block's kernels. The GPU runs them asynchronously, so the
host's time hides behind the GPU's while the GPU is the slower of the two, and sets the pass
when it is not (small micro-batches, small models)::

    fwd_i = max(fwd_i, h)    bwd_i = max(bwd_i, h)     block rows; full recompute re-runs fwd_i

A floor, not an addition: an added constant per pass was tried on the open MPT runs' calibration
split and the fit put it at 0 (docs/validation.md); the floor leaves every open run unchanged
(each block pass there takes milliseconds) and closes autopar's own small-micro-batch misses on
one H100 (docs/validation-gpu.md).

ZeRO's HBM traffic (``zero_param_s``, ``costmodels.model.zero_traffic``; GPU profiles only): a
ZeRO-2/3 collective hidden behind a micro-batch still moves its bytes, and the runtime's copies
around it, through HBM; per parameter of the row, those seconds join its forward and backward.

Everything here is a pure function of (table, profile, t, sp, b, recompute, attention, tier,
precision, the runtime's figures), cached per table and profile, so the search and ``estimate``
get bit-identical numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from costmodels.contracts.layer_table import LayerTable
from costmodels.model.comm import collective_time
from costmodels.model.table_arrays import TableArrays, activation_bytes_none, table_arrays
from costmodels.profiles.hardware import HardwareProfile, LinkTier

# precisions of autopar's own runtime (validate, apply); "bf16-mixed" is Megatron-LM's recipe
RUNTIME_PRECISIONS = ("amp", "fp32")

C_FWD = 3.0   # bytes moved by non-matmul kernels in the forward, per saved-activation byte
C_BWD = 6.0   # ... in the backward (= 2·C_FWD)
LOSS_BYTES_PER_LOGIT = 44.0  # cross-entropy over the logits, forward + backward (docstring)
ATTN_BWD_RATIO = 2.0         # attention-core backward FLOPs / forward (dQ, dK, dV, dP vs QK, PV)
# a flash kernel's backward recomputes the scores Q·Kᵀ it did not store: 5 matmuls of the
# forward's size (S = Q·Kᵀ again, dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q) against the
# forward's 2 (Dao 2023, FlashAttention-2, Algorithm 2), where the counted FLOPs say 2x
FLASH_BWD_RATIO = 2.5


@dataclass(frozen=True, eq=False)
class RowTimes:
    """Per-row times (seconds) and TP bytes for one micro-batch on one GPU.

    ``fwd_s``/``bwd_s``/``recompute_s`` are compute (+ memory traffic) only; ``tp_fwd_s``,
    ``tp_bwd_s``, ``tp_recompute_s`` the exposed TP collectives; ``tp_bytes_*`` the bytes each
    GPU sends for them. ``prefix(name)`` gives cumulative sums for O(1) range sums.
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    recompute_s: np.ndarray
    tp_fwd_s: np.ndarray
    tp_bwd_s: np.ndarray
    tp_recompute_s: np.ndarray
    tp_bytes_fwd: np.ndarray
    tp_bytes_bwd: np.ndarray
    tp_bytes_recompute: np.ndarray
    bwd_w_s: np.ndarray             # of bwd_s: the weight-gradient (W) pass

    def __post_init__(self):
        pre = {}
        for name in ("fwd_s", "bwd_s", "recompute_s", "tp_fwd_s", "tp_bwd_s", "tp_recompute_s",
                     "tp_bytes_fwd", "tp_bytes_bwd", "tp_bytes_recompute", "bwd_w_s"):
            pre[name] = np.concatenate(([0.0], np.cumsum(getattr(self, name))))
        object.__setattr__(self, "_prefix", pre)

    @cached_property
    def row_total_s(self) -> np.ndarray:
        """τ_i: everything a row costs one micro-batch on the critical path (compute, recompute
        and the exposed TP collectives), the per-row time the search's split program sums."""
        return (self.fwd_s + self.bwd_s + self.recompute_s + self.tp_fwd_s + self.tp_bwd_s
                + self.tp_recompute_s)

    def range_sum(self, name: str, start: int, end: int) -> float:
        """Sum of ``name`` over rows [start, end)."""
        p = self._prefix[name]
        return float(p[end] - p[start])


def runs_on_cpu(profile: HardwareProfile) -> bool:
    """A CPU profile (``torch CPU`` in its model, as ``autopar profile`` writes it): host and
    compute are one thread there, and gloo's copies are inside its measured collective times."""
    return "torch cpu" in profile.gpu_model.lower()


def host_block_floor(profile: HardwareProfile, runtime) -> float:
    """The runtime's host time per block pass ("Host" above) where it can floor a pass: on a GPU,
    whose kernels run behind the host's queue. 0 on a CPU profile (``runs_on_cpu``): the
    measured rates already hold the host's time."""
    if runs_on_cpu(profile):
        return 0.0
    return float(runtime.host_block_s)


def row_times(table: LayerTable, profile: HardwareProfile, tp: int, sp: bool, micro_batch: int,
              recompute: str, attention: str, tp_tier: str | LinkTier = "intra_node",
              precision: str = "bf16-mixed", elementwise_traffic: float | None = None,
              host_block_s: float = 0.0, zero_param_s: tuple[float, float] = (0.0, 0.0)) -> RowTimes:
    """Per-row forward / backward / recompute time and TP collective time for one micro-batch.
    ``precision`` names the recipe (module docstring: Megatron for "bf16-mixed", autopar's own
    for "amp" / "fp32"), which decides how the loss and TP's whole parameters are handled;
    ``elementwise_traffic`` is the runtime's ``C_FWD`` (its kernels; None: ``C_FWD``); ``tp_tier``
    the TP group's tier by name or as ``HardwareProfile.group_link`` resolved it;
    ``host_block_s`` the runtime's host time per block pass (module docstring, "Host");
    ``zero_param_s`` ZeRO's HBM seconds per parameter, forward and backward
    (``costmodels.model.zero_traffic``; ``coefficients.zero_hbm_param_s`` gives a plan's)."""
    return _row_times(table_arrays(table), profile, int(tp), bool(sp), int(micro_batch),
                      recompute, attention, tp_tier, precision, elementwise_traffic,
                      float(host_block_s), tuple(float(x) for x in zero_param_s))


@lru_cache(maxsize=4096)
def row_matmul_efficiency(arr: TableArrays, profile: HardwareProfile, k: float, tp: int) -> np.ndarray:
    """Each row's matmul efficiency, the FLOP-weighted harmonic mean over its GEMMs (one GPU, the
    micro-batch ``k`` times the table's, tp-sharded): the rate at which the row's FLOPs run. Rows
    without GEMMs get 1.0. Shared by the row times and the MoE attention-core correction."""
    f_mm = arr.mm_flops * k / tp
    e_mm = profile.matmul_efficiency(f_mm)
    num = np.bincount(arr.mm_row, weights=f_mm, minlength=arr.n)
    den = np.bincount(arr.mm_row, weights=f_mm / e_mm, minlength=arr.n)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def _row_times(arr: TableArrays, profile: HardwareProfile, tp: int, sp: bool, b: int,
               recompute: str, attention: str, tp_tier, precision: str,
               elementwise_traffic: float | None = None, host_block_s: float = 0.0,
               zero_param_s: tuple[float, float] = (0.0, 0.0)) -> RowTimes:
    c_fwd = C_FWD if elementwise_traffic is None else elementwise_traffic
    c_bwd = C_BWD if elementwise_traffic is None else 2.0 * elementwise_traffic
    t = arr.table
    autopar_rt = precision in RUNTIME_PRECISIONS
    # the loss: vocab-parallel in Megatron (1/t of the logits per rank), whole logits in autopar
    logits = arr.loss_logits if autopar_rt else arr.loss_logits / tp
    k = b / t.micro_batch
    peak = profile.peak_flops_per_s(t.act_dtype_bytes)
    eff = row_matmul_efficiency(arr, profile, k, tp)
    ew = profile.elementwise_bw
    act = activation_bytes_none(arr, tp, sp, b, attention)
    fwd = k * arr.fwd_flops / (tp * peak * eff) + c_fwd * act / ew
    bwd = k * arr.bwd_flops / (tp * peak * eff) + c_bwd * act / ew
    bwd_w = k * arr.wgt_flops / (tp * peak * eff)
    if attention == "flash" and profile.attention_efficiency is not None:
        # the fused attention core at its own measured efficiency instead of the row's
        fa = k * arr.attn_core_flops / tp
        fix = fa / peak * (1.0 / profile.attention_efficiency - 1.0 / eff)
        fwd = fwd + fix
        bwd = (bwd + ATTN_BWD_RATIO * fix
               + ((profile.attention_bwd_ratio or FLASH_BWD_RATIO) - ATTN_BWD_RATIO) * fa
               / (peak * profile.attention_efficiency))   # the kernel stack's ratio (kernel_stack.py)
    if profile.ce_logits:   # measured (autopar profile) at this size, fwd and bwd alike
        n = k * logits
        loss = np.where(n > 0, n / profile.cross_entropy_logits_per_s(np.maximum(n, 1.0)) / 2, 0.0)
    else:                                    # bytes at the element-wise rate (docstring)
        loss = k * logits * LOSS_BYTES_PER_LOGIT / 2 / ew
    fwd = fwd + loss
    bwd = bwd + loss
    again = fwd   # a full recompute re-runs the forward's compute, not its ZeRO gather
    if any(zero_param_s):   # ZeRO's collectives and copies share the GPU's HBM (zero_traffic)
        fwd = fwd + zero_param_s[0] * arr.params / tp
        bwd = bwd + zero_param_s[1] * arr.params / tp
    if host_block_s:   # a block pass takes at least the host's time to issue it ("Host")
        fwd = np.where(arr.is_block, np.maximum(fwd, host_block_s), fwd)
        bwd = np.where(arr.is_block, np.maximum(bwd, host_block_s), bwd)
        again = np.where(arr.is_block, np.maximum(again, host_block_s), again)

    # TP collectives per direction
    zeros = np.zeros(arr.n)
    if tp > 1:
        tier = profile.tier(tp_tier) if isinstance(tp_tier, str) else tp_tier
        nbytes = arr.tp_comm_bytes * k
        if sp:
            tb_ag, ts_ag = collective_time("all_gather", nbytes, tp, tier)
            tb_rs, ts_rs = collective_time("reduce_scatter", nbytes, tp, tier)
            one_b, one_s = tb_ag + tb_rs, ts_ag + ts_rs
            # each TP pair: one AG + one RS per direction instead of one all-reduce
            tp_bytes, tp_time = arr.tp_collectives * one_b, arr.tp_collectives * one_s
        else:
            one_b, one_s = collective_time("all_reduce", nbytes, tp, tier)
            tp_bytes, tp_time = arr.tp_collectives * one_b, arr.tp_collectives * one_s
        tp_time = np.where(nbytes > 0, tp_time, 0.0)
        tp_fwd_b, tp_fwd_t = tp_bwd_b, tp_bwd_t = tp_bytes, tp_time
        if autopar_rt:
            # autopar all-gathers the vocab-parallel logits for the loss (forward only): a list
            # all-gather along the last dim, then a cat (one more read + write of the logits)
            lb = k * arr.loss_logits * (4 if precision == "fp32" else t.act_dtype_bytes)
            gb, gt = collective_time("all_gather", lb, tp, tier)
            gt = gt + 2.0 * lb / profile.hbm_bandwidth_bytes_per_s
            tp_fwd_b, tp_fwd_t = tp_bytes + gb, tp_time + np.where(arr.loss_logits > 0, gt, 0.0)
        if sp and autopar_rt:
            # the gradients of the parameters TP leaves whole, one all-reduce each and micro-batch
            # (fp32); Megatron all-reduces them once per step in one bucket: negligible
            rb, rt = collective_time("all_reduce", 4.0 * float(t.hidden or 1), tp, tier)
            tp_bwd_b, tp_bwd_t = tp_bytes + arr.tp_replicated * rb, tp_time + arr.tp_replicated * rt
    else:
        tp_bytes, tp_time = zeros, zeros
        tp_fwd_b, tp_fwd_t = tp_bwd_b, tp_bwd_t = zeros, zeros

    if recompute == "full":
        rec = np.where(arr.is_block, again, 0.0)
        tp_rec_s = np.where(arr.is_block, tp_time, 0.0)
        tp_rec_b = np.where(arr.is_block, tp_bytes, 0.0)
    elif recompute == "selective" and attention == "math":
        fc = arr.attn_core_flops * k / tp
        rec = np.where(fc > 0, fc / (peak * profile.matmul_efficiency(np.maximum(fc, 1.0))), 0.0)
        rec = rec + c_fwd * arr.core * k / tp / ew
        tp_rec_s = tp_rec_b = zeros
    else:
        rec = zeros
        tp_rec_s = tp_rec_b = zeros
    return RowTimes(fwd_s=fwd, bwd_s=bwd, recompute_s=rec, tp_fwd_s=tp_fwd_t, tp_bwd_s=tp_bwd_t,
                    tp_recompute_s=tp_rec_s, tp_bytes_fwd=tp_fwd_b, tp_bytes_bwd=tp_bwd_b,
                    tp_bytes_recompute=tp_rec_b, bwd_w_s=bwd_w)
