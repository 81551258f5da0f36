"""FP8 GEMM shapes: which layouts a stack's FP8 linears can multiply at all.

FP8 tensor-core GEMMs take operands whose dimensions are multiples of 8 or 16, and the stacks
check it on every linear's LOCAL shard, after tensor parallelism has cut it. So an FP8 plan whose
tp leaves a shard off those multiples does not run: Llama 2 7B's MLP (ffn 11008) at tp 32 gives
the row-parallel ``fc2`` a ``[4096, 344]`` shard, and 344 is not a multiple of 16. The runtime
profile names the rule its stack applies (``[capabilities] fp8_gemm_shapes``); ``estimate``
refuses a plan that breaks it in one line (``check_fp8_shapes``) and the search never offers one
(``autopar.search.space.configurations`` asks ``fp8_shape_rule``). BF16 plans are never touched.

* ``transformer-engine`` (Megatron-core / NeMo: every block linear is a TE module, all converted):
  ``assert_dim_for_fp8_exec`` on the input and each weight of every FP8 forward, "dim0 divisible
  by 8 and dim1 divisible by 16" — a weight ``[out, in]`` needs ``out % 8`` and ``in % 16``, the
  input ``[tokens, in]`` ``tokens % 8`` (NVIDIA/TransformerEngine v1.3 5b90b7f,
  ``transformer_engine/pytorch/utils.py`` ``check_dim_for_fp8_exec``, called in
  ``module/linear.py``, ``layernorm_linear.py`` and ``layernorm_mlp.py`` on ``inputmat``,
  ``weight``, ``fc1_weight``, ``fc2_weight``; the same rule, ``prod(shape[:-1]) % 8`` and
  ``shape[-1] % 16``, at d0067d0 (Aug 2026) under ``if fp8:``, which every FP8 recipe sets,
  MXFP8 included). With sequence parallelism the checked input is the rank's sequence shard.
* ``torch-scaled-mm`` (torchtitan's float8 through torchao): ``torch._scaled_mm`` checks
  "trailing dimension of mat1 divisible by 16" and both dims of mat2 divisible by 16
  (pytorch/pytorch ``aten/src/ATen/native/cuda/Blas.cpp``, ``_scaled_mm_out_cuda``, tensorwise
  and rowwise scaling alike; pytorch/ao ``torchao/float8/config.py`` at 024fe94,
  ``Float8LinearConfig.pad_inner_dim``, off by default: "N, K must be a multiple of 16").
  Float8Linear's three GEMMs (output, grad input, grad weight) then need the local weight's
  ``out`` and ``in`` and the matmul's tokens (``mbs·seq/cp``: the sequence-parallel input is
  gathered before it) multiples of 16. torchtitan converts a linear
  only when its WHOLE weight is a multiple of 16 both ways (``module_filter_fn``,
  torchtitan/components/quantization/utils.py, 0.2.2), before tensor parallelism shards it, so
  the rule binds the converted linears only. MXFP8 (another op) is not covered.

The ``fsdp`` runtime with its ``fsdp1`` option is Composer, which multiplies through ``te.Linear``
(``costmodels.model.precision.stack_key``): Transformer Engine's rule, every linear converted.

autopar's own runtime converts each LOCAL shard only when it is a multiple of 16 and leaves the
others in BF16 (``autopar.runtime.assemble.float8``): it never refuses, so its profile names no
rule. Routed-expert linears (grouped GEMMs), the MoE router and the LM head (BF16 in every stack)
are not checked; shared experts are (Megatron-core builds them of TE linears).

Which block linear tensor parallelism splits along which side is read off the layer table's
matmul shapes: ``[out, hidden]`` is column-parallel (``out / tp``), ``[hidden, in]`` row-parallel
(``in / tp``); a ``[hidden, hidden]`` one is checked both ways (the query and the output
projection of an attention whose heads span the hidden size have that shape, one of each).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from costmodels.contracts.errors import PlanError

RULES = ("transformer-engine", "torch-scaled-mm")
# the plan precisions each rule binds (the stack's FP8 GEMM path; costmodels.model.precision.STACKS)
PRECISIONS = {"transformer-engine": ("fp8", "mxfp8"), "torch-scaled-mm": ("fp8", "fp8-rowwise")}


@dataclass(frozen=True)
class Fp8Shapes:
    """What the rule reads of a model: the hidden size, the distinct ``(out, in)`` of its block
    linears (whole, before tp), the tokens of one sample. ``hidden`` None: nothing is checked."""

    hidden: int | None
    linears: tuple[tuple[int, int], ...] = ()
    seq: int | None = None

    @classmethod
    def of_table(cls, table) -> Fp8Shapes:
        tokens = table.micro_batch * table.seq
        # not the MoE router ([experts, hidden]: a plain, replicated linear in Megatron-core's TopKRouter)
        found = {(n, k) for r in table.rows if r.kind == "block" for m, n, k in r.matmul_dims
                 if m == tokens and not (getattr(r, "experts", 0) and n == r.experts)}
        return cls(hidden=table.hidden, linears=tuple(sorted(found)), seq=table.seq)


def _shards(shapes: Fp8Shapes, tp: int):
    """((out, in) whole, (out, in) on one tp rank) of each block linear (module docstring)."""
    h = shapes.hidden
    for out, inn in shapes.linears:
        sides = []
        if inn == h:
            sides.append((out / tp, inn))       # column-parallel: the output features split
        if out == h:
            sides.append((out, inn / tp))       # row-parallel: the input features split
        for lo, li in sides:
            if float(lo).is_integer() and float(li).is_integer():
                yield (out, inn), (int(lo), int(li))


@lru_cache(maxsize=4096)
def _violation(rule: str, shapes: Fp8Shapes, tp: int, cp: int, sp: bool, mbs: int) -> str | None:
    if not shapes.hidden or not shapes.linears:
        return None
    tokens = mbs * (shapes.seq or 0) // max(1, cp)
    if rule == "transformer-engine":
        for whole, (lo, li) in _shards(shapes, tp):
            if lo % 8 or li % 16:
                return (f"the block linear [{whole[0]}, {whole[1]}] is [{lo}, {li}] on a tp={tp} rank and "
                        f"Transformer Engine's FP8 GEMMs need [multiple of 8, multiple of 16] "
                        f"({lo} % 8 = {lo % 8}, {li} % 16 = {li % 16}; assert_dim_for_fp8_exec)")
        rows = tokens // (tp if sp else 1)
        if shapes.seq and rows % 8:
            return (f"each FP8 linear's input has {rows} token rows on a rank (micro_batch_size·seq/cp"
                    f"{'/tp' if sp else ''}) and Transformer Engine's FP8 GEMMs need a multiple of 8")
        return None
    converted = [(w, s) for w, s in _shards(shapes, tp) if w[0] % 16 == 0 and w[1] % 16 == 0]
    for whole, (lo, li) in converted:
        if lo % 16 or li % 16:
            return (f"the block linear [{whole[0]}, {whole[1]}] is [{lo}, {li}] on a tp={tp} rank and "
                    f"torch._scaled_mm needs both dims multiples of 16 (torchao float8)")
    if converted and shapes.seq and tokens % 16:
        return (f"each FP8 linear multiplies {tokens} tokens on a rank (micro_batch_size·seq/cp) and "
                "torch._scaled_mm's weight-gradient GEMM needs a multiple of 16 (torchao float8)")
    return None


def fp8_shape_rule(rt, plan, shapes: Fp8Shapes | None) -> str | None:
    """The reason ``plan`` (a Plan or the search's Config) cannot run its FP8 GEMMs on ``rt``'s
    stack, or None (BF16, a runtime without a rule, a model of unknown shape)."""
    rule = getattr(rt, "fp8_gemm_shapes", "")
    if rule and getattr(rt, "base", "") == "fsdp" and "fsdp1" in getattr(rt, "options", ()):
        rule = "transformer-engine"   # Composer under FSDP1 multiplies through te.Linear (precision.stack_key)
    p = getattr(plan, "precision", "bf16")
    if not rule or shapes is None or p not in PRECISIONS.get(rule, ()):
        return None
    return _violation(rule, shapes, plan.tp, getattr(plan, "cp", 1), bool(plan.sequence_parallel),
                      plan.micro_batch_size)


def good_tps(rt, plan, shapes: Fp8Shapes, limit: int = 64, kv_heads: int = 0) -> list[int]:
    """The tp degrees dividing ``limit`` (the heads) and ``kv_heads`` that the rule admits."""
    from types import SimpleNamespace

    def at(t):   # the plan's fields the rule reads, at another tp (no Plan: its other rules aside)
        return SimpleNamespace(precision=plan.precision, tp=t, cp=getattr(plan, "cp", 1),
                               sequence_parallel=plan.sequence_parallel and t > 1,
                               micro_batch_size=plan.micro_batch_size)
    return [t for t in range(1, limit + 1) if limit % t == 0 and kv_heads % t == 0
            and not fp8_shape_rule(rt, at(t), shapes)]


def check_fp8_shapes(table, plan, rt) -> None:
    """Raise one PlanError line where ``plan``'s FP8 GEMMs cannot run on ``rt``'s stack."""
    if getattr(plan, "precision", "bf16") == "bf16" or not getattr(rt, "fp8_gemm_shapes", ""):
        return
    shapes = Fp8Shapes.of_table(table)
    why = fp8_shape_rule(rt, plan, shapes)
    if why:
        if "token" in why:
            fix = "change micro_batch_size, cp or sequence_parallel"
        else:
            ok = good_tps(rt, plan, shapes, table.heads, table.kv_heads or table.heads) if table.heads else []
            fix = f"choose tp in {ok}" if ok else "change tp"
        raise PlanError(f"plan field 'precision'='{plan.precision}' with tp={plan.tp} on runtime "
                        f"'{rt.name}': {why}; use precision='bf16' or {fix}")


def pinned_reason(rt, fix: dict, shapes: Fp8Shapes | None) -> str | None:
    """Why a search whose ``--fix`` pins an FP8 precision and a tp has no configuration, where
    this rule is the reason (the search's "no plan can exist" message names it)."""
    from types import SimpleNamespace
    if fix.get("precision", "bf16") == "bf16" or "tp" not in fix:
        return None
    probe = SimpleNamespace(precision=fix["precision"], tp=fix["tp"], cp=fix.get("cp", 1),
                            sequence_parallel=False, micro_batch_size=fix.get("micro_batch_size", 1))
    why = fp8_shape_rule(rt, probe, shapes)
    return f"precision={fix['precision']} at tp={fix['tp']} on runtime '{rt.name}': {why}" if why else None
