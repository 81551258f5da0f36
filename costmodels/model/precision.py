"""FP8 matmuls: what a plan's ``precision`` ("fp8", "fp8-rowwise", "mxfp8") changes in the cost.

Not estimate()'s ``precision=`` keyword (the memory recipe "bf16-mixed" / "amp" / "fp32"): that
says how weights, gradients and optimizer state are kept; this says in which number format the
block's linear layers multiply. An FP8 plan keeps the bf16-mixed (or amp) recipe around it; under
the "fp32" recipe it is refused (``check_plan_precision``).

Which matmuls run in FP8 and what it costs is the stack's (``STACKS``, keyed by runtime profile
name; each entry cites the code it reads):

* every linear layer of a transformer block (QKV, attention output, MLP) — the rows' matmuls with
  one row per token (``matmul_dims`` with ``m = b·s``); the attention core (Q·Kᵀ, scores·V) stays
  in BF16 (Transformer Engine's FP8 dot-product attention is off by default, torchao converts
  only ``nn.Linear``), the LM head stays in BF16 (Megatron's output layer is not a TE module;
  torchtitan's float8 converter filters out ``output``), and element-wise work is unchanged;
* its matmul time at the FP8 (or MXFP8) dense peak ``P8``, with the efficiency curve placed by
  time at peak (a matmul of ``f`` FLOPs in FP8 reaches ``eff(f · P/P8)`` of ``P8``, the size
  that takes as long in BF16) times the fitted ``fp8_matmul_scale`` of (GPU, stack)
  (``HardwareProfile.fp8_matmul_scale``; benchmarks/bench_costmodels_fp8.py fits it)::

      t8_j = f_j / (P8 · eff(f_j · P / P8) · scale)    forward; the backward's dgrad and
                                                         wgrad twice that, the W pass once

  against the ``f_j / (P · eff_row)`` the BF16 row charged them;
* the casts: each matmul's operands are scaled and cast before it runs — bytes moved per
  element at the element-wise bandwidth (``cast_bytes``): the input ``m·k``, the output gradient
  ``m·n`` (backward) and the weight ``k·n`` (every micro-batch where the stack re-casts it, once
  per step where it keeps FP8 weights). Per element: read 2 + write 1 for the cast itself, plus
  a read 2 for the amax of current (dynamic) scaling, plus a write 1 for the transposed copy the
  backward's other matmul reads (TE's columnwise copy, torchao's second cast);
* memory: activations the stack saves for the weight gradient in FP8 (TE saves the FP8 input,
  1 byte instead of 2 per element of each linear's input); weights TE keeps in FP8
  (``fp8_params``: 1 byte per linear weight instead of 2);
* FSDP: with the stack's float8 all-gather (torchtitan ``enable_fsdp_float8_all_gather``) each
  ZeRO gather moves 1 byte per linear weight instead of 2 — over the link (``fp8_weight_share``)
  and through HBM (the gather and FSDP2's copy out of its buffer, ``zero_traffic``) — and the
  weight cast runs on the shard;
* tensor parallelism: torchao's float8 TP all-gathers the sequence-parallel inputs (and the
  backward's output gradients) in FP8 (``fp8_tensor_parallel``); a full recompute re-runs the
  forward's FP8 matmuls, casts and FP8 all-gathers.

Pure functions of (table, profile, plan, runtime); the search reads the same (coefficients).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from costmodels.contracts.checks import quote
from costmodels.contracts.errors import PlanError
from costmodels.model.fp8_tensor_parallel import fp8_tp_all_gather

LOW_PRECISIONS = ("fp8", "fp8-rowwise", "mxfp8")
PEAK_KEY = {"fp8": "fp8", "fp8-rowwise": "fp8", "mxfp8": "mxfp8"}


@dataclass(frozen=True)
class Fp8Stack:
    """How one runtime (stack) runs FP8 training."""

    name: str
    delayed_scaling: bool         # amax from history (no extra read) vs current scaling
    weight_cast_per_micro_batch: bool   # re-casts the weights every forward (else once per step)
    saves_fp8_inputs: bool        # the input saved for the weight gradient is the FP8 copy
    fp8_weights: bool             # keeps FP8 weights instead of BF16 (fp8_params)
    fp8_all_gather: bool          # FSDP / ZeRO-3 gathers FP8 weights
    precisions: tuple[str, ...]   # which plan precisions it runs
    source: str
    fp8_tp_all_gather: tuple[str, ...] = ()   # precisions whose TP all-gathers move FP8 (fp8_tensor_parallel)


STACKS = {
    "megatron": Fp8Stack(
        "Transformer Engine", True, False, True, True, False, ("fp8", "mxfp8"),
        "Megatron-core TE layers (--fp8-format hybrid --fp8-recipe delayed/mxfp8; NeMo fp8_params=True): "
        "TE Linear casts with amax history (transformer_engine/pytorch/module/linear.py), saves the "
        "FP8 input for wgrad, keeps FP8 weight copies (fp8_model_init); the distributed optimizer's "
        "weight all-gather is priced at bf16 (NeMo 2's fp8_param_gather gathers FP8, hidden under "
        "overlap_param_gather in every open run); with sequence parallelism TE quantizes a "
        "column-parallel input before its all-gather and the output gradient before the backward's "
        "(linear.py / layernorm_linear.py with_input_all_gather_nccl, base.py grad_output_preprocess; "
        "userbuffers' fp8 buffers alike)",
        fp8_tp_all_gather=("fp8", "mxfp8")),
    "fsdp": Fp8Stack(
        "torchao float8 (torchtitan)", False, True, False, False, True, ("fp8", "fp8-rowwise", "mxfp8"),
        "torchao.float8.convert_to_float8_training as torchtitan's float8 converter applies it "
        "(torchtitan/components/quantization/float8.py): dynamic tensorwise scaling (amax read + "
        "cast per forward), enable_fsdp_float8_all_gather=True and precompute_float8_dynamic_scale_"
        "for_fsdp (the weight cast on the shard before the gather); saves the high-precision "
        "input (torchao Float8Linear default); rowwise: Float8LinearConfig.from_recipe_name('rowwise'), "
        "bf16 all-gather; tensor parallelism with Float8ColwiseParallel / Float8RowwiseParallel "
        "(torchao/float8/float8_tensor_parallel.py): the sequence-parallel all-gathers in float8 "
        "(tensorwise only: torchtitan keeps BF16 TP for rowwise and MX)",
        fp8_tp_all_gather=("fp8",)),
    "autopar": Fp8Stack(
        "torchao float8 (autopar.apply)", False, True, False, False, True, ("fp8", "fp8-rowwise", "mxfp8"),
        "autopar.runtime.assemble.float8 applies torchao.float8.convert_to_float8_training as "
        "torchtitan does (the fsdp entry)"),
    "composer": Fp8Stack(
        "Transformer Engine under Composer FSDP1", True, True, True, False, False, ("fp8",),
        "Composer precision='amp_fp8' wraps the step in te.fp8_autocast with TE's default "
        "DelayedScaling (composer/core/precision.py) on te.Linear layers; FSDP1 gathers BF16 weights, "
        "which TE casts every forward; TE saves the FP8 input"),
}


def stack_key(runtime) -> str:
    """The ``STACKS`` entry of a runtime profile: its base name, or ``composer`` for the fsdp
    profile with the ``fsdp1`` option (Composer drives torch FSDP1 and runs FP8 through TE)."""
    if runtime.base == "fsdp" and "fsdp1" in runtime.options:
        return "composer"
    return runtime.base


def check_plan_precision(plan, profile, runtime_name: str, recipe: str) -> None:
    """Refuse (one line) an FP8 plan the hardware, the stack or the memory recipe cannot run."""
    p = getattr(plan, "precision", "bf16")
    if p == "bf16":
        return
    key = PEAK_KEY[p]
    if key not in profile.peak_flops:
        have = [x for x in LOW_PRECISIONS if PEAK_KEY[x] in profile.peak_flops]
        raise PlanError(f"plan field 'precision'={quote(p)}: {profile.name} ({profile.gpu_model}) has no "
                        f"{key.upper()} tensor cores in its profile; use precision='bf16'"
                        + (f" or one of {', '.join(have)}" if have else "") + " (or a GPU with them)")
    stack = STACKS.get(runtime_name)
    if stack is None or p not in stack.precisions:
        ok = " or ".join(n for n, s in STACKS.items() if p in s.precisions and n != "composer")
        raise PlanError(f"plan field 'precision'={quote(p)}: runtime '{runtime_name}' has no {p} "
                        f"training recipe autopar can price; use runtime {ok} or precision='bf16'")
    if recipe == "fp32":
        raise PlanError(f"plan field 'precision'={quote(p)} runs FP8 matmuls inside a mixed-precision "
                        "recipe, not under the 'fp32' memory recipe; use precision 'bf16-mixed' or 'amp'")


def stack_scale(profile, runtime_name: str, precision: str = "fp8") -> float:
    """The fitted FP8 matmul efficiency scale of (GPU, stack); 1 where none was fitted. A
    rowwise plan reads ``<stack>-rowwise`` where the profile has it: ``torch._scaled_mm`` with
    rowwise scales runs another GEMM than the tensorwise one (on sm90 CUTLASS's
    ``f8f8bf16_rowwise`` kernel, aten/src/ATen/native/cuda/RowwiseScaledMM.cu, where tensorwise
    scales go to cuBLASLt), so its efficiency is its own figure; else the stack's."""
    scales = dict(profile.fp8_matmul_scale)
    if precision == "fp8-rowwise" and f"{runtime_name}-rowwise" in scales:
        return scales[f"{runtime_name}-rowwise"]
    return scales.get(runtime_name, 1.0)


@dataclass(frozen=True, eq=False)
class LinearDims:
    """The block linears of each row at the table's micro-batch: FLOPs per matmul, and per row
    the elements of their inputs, outputs and weights."""

    mm_row: np.ndarray
    mm_flops: np.ndarray
    inputs: np.ndarray      # per row: Σ m·k
    outputs: np.ndarray     # per row: Σ m·n
    weights: np.ndarray     # per row: Σ k·n


@lru_cache(maxsize=64)
def linear_dims(arr) -> LinearDims:
    t = arr.table
    tokens = t.micro_batch * t.seq
    rows, flops = [], []
    n = arr.n
    inp, out, wgt = np.zeros(n), np.zeros(n), np.zeros(n)
    for i, r in enumerate(t.rows):
        if r.kind != "block":
            continue
        for m, nn, k in r.matmul_dims:
            if m != tokens:
                continue   # batched score matmuls of the attention core
            rows.append(i)
            flops.append(2.0 * m * nn * k)
            inp[i] += m * k
            out[i] += m * nn
            wgt[i] += k * nn
    return LinearDims(np.array(rows, dtype=int), np.array(flops, dtype=float), inp, out, wgt)


def cast_bytes(stack: Fp8Stack) -> float:
    """Bytes moved per element cast: read 2 + write 1, + read 2 for a current amax, + write 1
    for the transposed copy (module docstring)."""
    return 3.0 + (0.0 if stack.delayed_scaling else 2.0) + 1.0


def fp8_row_times(rt, arr, profile, plan, runtime_name: str, tp: int, b: int, dp: int, zero: int,
                  zero_param_s: tuple[float, float] = (0.0, 0.0)):
    """``RowTimes`` of a BF16 row model with the block linears moved to FP8 (docstring);
    ``zero_param_s``: the ZeRO HBM seconds per parameter ``row_times`` charged (zero_traffic)."""
    p = getattr(plan, "precision", "bf16")
    if p == "bf16":
        return rt
    check_plan_precision(plan, profile, runtime_name, "bf16-mixed")   # no FP8 peak / stack: one line
    stack = STACKS[runtime_name]
    ld = linear_dims(arr)
    if not len(ld.mm_flops):
        return rt
    t = arr.table
    k = b / t.micro_batch
    peak = profile.peak_flops_per_s(t.act_dtype_bytes)
    peak8 = profile.peak_flops[PEAK_KEY[p]] * stack_scale(profile, runtime_name, p)
    # the row's BF16 efficiency, as compute charged it (flops-weighted harmonic mean)
    f_all = arr.mm_flops * k / tp
    e_all = profile.matmul_efficiency(f_all)
    num = np.bincount(arr.mm_row, weights=f_all, minlength=arr.n)
    den = np.bincount(arr.mm_row, weights=f_all / e_all, minlength=arr.n)
    eff_row = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
    f = ld.mm_flops * k / tp
    t8 = f / (peak8 * profile.matmul_efficiency(f * peak / profile.peak_flops[PEAK_KEY[p]]))
    t16 = f / (peak * eff_row[ld.mm_row])
    d = np.bincount(ld.mm_row, weights=t8 - t16, minlength=arr.n)
    cb, ew = cast_bytes(stack), profile.elementwise_bw
    w_cast = ld.weights / tp * cb * (1.0 if stack.weight_cast_per_micro_batch else 0.0)
    if stack.fp8_all_gather and zero >= 2 and dp > 1:
        w_cast = w_cast / dp     # cast on the shard before the FP8 gather
    fwd_cast = (k * ld.inputs / tp * cb + w_cast) / ew
    bwd_cast = (k * ld.outputs / tp * cb + w_cast) / ew
    if stack.fp8_all_gather and p == "fp8" and zero >= 2 and dp > 1:
        # the FP8 gather and FSDP2's copy out of its buffer move 1 byte per linear weight, not 2
        # (zero_traffic's gather term, ``zero_param_s[0]`` per parameter, is all gather; ZeRO-3
        # gathers again before the backward)
        g = 0.5 * zero_param_s[0] * ld.weights / tp
        fwd_cast = fwd_cast - g
        bwd_cast = bwd_cast - (g if zero >= 3 else 0.0)
    # a full recompute re-runs the block's forward, its FP8 matmuls and casts included
    rec = rt.recompute_s + (np.where(arr.is_block, d + fwd_cast, 0.0) if plan.recompute == "full" else 0.0)
    rt = replace(rt, fwd_s=rt.fwd_s + d + fwd_cast, bwd_s=rt.bwd_s + 2.0 * d + bwd_cast,
                 bwd_w_s=rt.bwd_w_s + d, recompute_s=rec)
    if p in stack.fp8_tp_all_gather:
        rt = fp8_tp_all_gather(rt, arr, profile.group_link(plan, "tp"), tp, b, plan.sequence_parallel,
                               plan.recompute == "full")
    return rt


def fp8_weight_share(arr, plan, runtime_name: str, zero: int) -> np.ndarray:
    """Per row, the factor on ZeRO gather bytes: linear weights at 1 byte of 2 under a stack's
    FP8 all-gather, 1 elsewhere."""
    p = getattr(plan, "precision", "bf16")
    stack = STACKS.get(runtime_name)
    if p != "fp8" or stack is None or not stack.fp8_all_gather or zero < 2:
        return np.ones(arr.n)
    share = np.minimum(1.0, linear_dims(arr).weights / np.maximum(arr.params, 1.0))
    return 1.0 - 0.5 * share


def fp8_saved_bytes(arr, plan, runtime_name: str, tp: int, b: int) -> np.ndarray:
    """Per row, activation bytes the stack saves less by keeping linear inputs in FP8 (TE): one
    byte of the activation dtype's per input element (per GPU, inputs taken as split over tp)."""
    p = getattr(plan, "precision", "bf16")
    stack = STACKS.get(runtime_name)
    if p == "bf16" or stack is None or not stack.saves_fp8_inputs:
        return np.zeros(arr.n)
    k = b / arr.table.micro_batch
    return k * linear_dims(arr).inputs / tp * max(0, arr.table.act_dtype_bytes - 1)
