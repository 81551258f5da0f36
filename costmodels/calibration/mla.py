"""Multi-head Latent Attention (DeepSeek-V2/V3's MLA) in an analytic layer table, as Megatron-core
runs it: parameters, forward FLOPs, the activations autograd keeps, the matmuls, and the selective
recompute of the up-projections (``--recompute-modules mla_up_proj``).

MLA (``megatron/core/transformer/multi_latent_attention.py``, NVIDIA/Megatron-LM f98b1a008b76, the
core_r0.12.0 commit NeMo v2.3.1's ``requirements/manifest.json`` pins; the same structure at
003b4ce2615f) replaces the q/k/v projections of multi-head attention by low-rank ones. Per token,
hidden ``h``, ``a`` heads, ranks ``r_q`` (``q_lora_rank``; None: one ``h → a·d_qk`` projection)
and ``r_kv``, head widths ``d_n`` (``qk_head_dim``, no position), ``d_r`` (``qk_pos_emb_head_dim``,
RoPE) and ``d_v``, ``d_qk = d_n + d_r``::

    linear_q_down_proj   h → r_q            q_layernorm, then linear_q_up_proj  r_q → a·d_qk
    linear_kv_down_proj  h → r_kv + d_r     kv_layernorm, then linear_kv_up_proj r_kv → a·(d_n + d_v)
    core attention       q·kᵀ over d_qk, scores·v over d_v (the RoPE part of k shared by the heads)
    linear_proj          a·d_v → h

    params     h·r_q + r_q + r_q·a·d_qk + h·(r_kv + d_r) + r_kv + r_kv·a·(d_n + d_v) + a·d_v·h
    fwd FLOPs  2·tokens·(the linears' weights above) + 2·b·s²·a·(d_qk + d_v)   (non-causal, as
               the MHA table counts 4·b·s²·h)

For DeepSeek-V3 (h 7168, 128 heads, r_q 1536, r_kv 512, d_n 128, d_r 64, d_v 128) that is 710 M
forward FLOPs per token at s = 4096 against 528 M for the multi-head attention of head size
h/a = 56 the table priced before (1,506 M against 1,325 M per MoE block with its experts).

**Saved for the backward** (bf16; Megatron-core's TE spec: flash / fused attention, which keeps
``q``, ``k``, ``v`` and its output; ``linear_proj`` keeps the same output as its input;
``linear_q_up_proj`` / ``linear_kv_up_proj`` are ``TELayerNormColumnParallelLinear``, the
q / kv layernorm fused in, keeping their input and the normalized output)::

    TP part         2·a·(2·d_qk + 2·d_v)   per token: q, k (RoPE part broadcast to each head),
                                           v, and the attention output
    outside TP      2·2·(r_q + r_kv)       the compressed q and kv and their normalized copies
                                           (sequence-parallel: split over tp with sp)

**Recompute of the up-projections** (``mla_up_proj``; ``recompute_granularity = 'selective'``):
``qkv_up_proj_and_rope_apply`` runs under ``CheckpointWithoutOutput``, whose outputs (q, k, v) are
discarded once the core attention has run (``discard_output_and_register_recompute``) and rebuilt
in the backward from the kept inputs (the compressed q / kv and the RoPE key). The TP part keeps
the attention output alone, ``2·a·d_v`` per token, and outside TP the checkpoint keeps its inputs
only, ``2·(r_q + r_kv + d_r)`` (the fused layernorms run inside it under no_grad, so their
normalized copies are not kept), and the backward runs the up-projections' forward again: ``2·tokens·(r_q·a·d_qk +
r_kv·a·(d_n + d_v))`` FLOPs. This is the recompute the dgxc-benchmarking DeepSeek-V3 launch asks
for on H100 (``--recompute_modules mla_up_proj``); its GB200 launch asks for ``core_attn``, the
core's selective recompute: on GB200 that release's Transformer Engine ran MLA's core unfused
(``costmodels.calibration.mla_attention_kernel``: plan ``attention = "math"``, ``recompute =
"selective"``). Selective and full recompute are exclusive in Megatron-core
(``recompute_granularity``): a table with the up-projection recompute is for plans without full
recompute.

**Tensor parallelism of the down-projections** (the table divides every linear by tp): at
f98b1a008b76, the commit the scored runs ran, Megatron-core's TE spec builds ``linear_q_down_proj``
and ``linear_kv_down_proj`` as ``TEColumnParallelLinear`` (``gpt_layer_specs.py``
``get_gpt_layer_with_transformer_engine_spec``, since 1c425a8313 of 2025-02-24): their weights and
FLOPs are split over tp, and ``MLASelfAttention.forward`` all-gathers their outputs
(``gather_from_tensor_model_parallel_region``) before the q / kv layernorms — so the division is
right for these rows. Megatron-core switched them back to a replicated ``TELinear`` in e63aee46b2
(2025-06-13; 00caa53 has it, ``parallel_mode = "duplicated"``): for a later Megatron the table
would undercharge 0.46 B of DeepSeek-V3's 671 B parameters at tp 2 (their FLOPs stay split under
sequence parallelism, each rank projecting its own part of the sequence). Not priced: at f98b1a0 the
column-parallel down-projections add TP all-gathers beyond the one the table's attention pair
counts (a second ``s·h`` one for ``linear_kv_down_proj``'s input and ``s·(2·r_q + 2·r_kv + d_r)``
for the compressed q / kv and the up-projections' inputs, about 1.6 ``s·h`` all-gathers per
direction and block; some 0.4 % of the dgxc DeepSeek-V3 steps at tp 2 on NVLink).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLAShape:
    """The low-rank attention's widths (names as Megatron-core's ``MLATransformerConfig``)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int

    @property
    def qk(self) -> int:
        return self.qk_head_dim + self.qk_pos_emb_head_dim


# DeepSeek-V3: NVIDIA/NeMo nemo/collections/llm/gpt/model/deepseek.py DeepSeekConfig (v2.3.1
# abddc854389e, lines 91-95; HEAD 8cfedd7203 the same), q_lora_rank 1536, kv_lora_rank 512,
# qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim 128 — HF config.json's q_lora_rank,
# kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, which NeMo's importer maps 1:1
DEEPSEEK_V3 = MLAShape(q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                       v_head_dim=128)


def _linears(h: int, a: int, m: MLAShape) -> tuple[tuple[int, int], ...]:
    """(in, out) of each linear of the attention, in forward order."""
    q = ((h, m.q_lora_rank), (m.q_lora_rank, a * m.qk)) if m.q_lora_rank else ((h, a * m.qk),)
    return q + ((h, m.kv_lora_rank + m.qk_pos_emb_head_dim),
                (m.kv_lora_rank, a * (m.qk_head_dim + m.v_head_dim)), (a * m.v_head_dim, h))


def up_linears(h: int, a: int, m: MLAShape) -> tuple[tuple[int, int], ...]:
    """The linears ``mla_up_proj`` recomputes (q's up / whole projection and kv's up)."""
    q = (m.q_lora_rank, a * m.qk) if m.q_lora_rank else (h, a * m.qk)
    return (q, (m.kv_lora_rank, a * (m.qk_head_dim + m.v_head_dim)))


def mla_params(h: int, a: int, m: MLAShape) -> int:
    """The attention's parameters: the linears and the q / kv layernorms' weights."""
    norms = (m.q_lora_rank or 0) + m.kv_lora_rank
    return sum(i * o for i, o in _linears(h, a, m)) + norms


def mla_fwd_flops(b: int, s: int, h: int, a: int, m: MLAShape) -> float:
    """Forward FLOPs of one micro-batch of ``b`` sequences of ``s`` tokens (module docstring)."""
    return 2.0 * b * s * sum(i * o for i, o in _linears(h, a, m)) + 2.0 * b * s * s * a * (m.qk + m.v_head_dim)


def up_proj_recompute_flops(b: int, s: int, h: int, a: int, m: MLAShape) -> float:
    """FLOPs the backward spends re-running the up-projections under ``mla_up_proj``."""
    return 2.0 * b * s * sum(i * o for i, o in up_linears(h, a, m))


def mla_saved_bytes(b: int, s: int, a: int, m: MLAShape, recompute_up_proj: bool,
                    dtype_bytes: int = 2) -> tuple[int, int]:
    """(TP part, outside-TP part) of the bytes the attention keeps for the backward, beyond the
    block input and the input norm's output the table counts for every block (module docstring)."""
    t = b * s * dtype_bytes
    outside = 2 * t * ((m.q_lora_rank or 0) + m.kv_lora_rank)
    if recompute_up_proj:   # the checkpoint's inputs: compressed q, kv and the RoPE key
        return a * m.v_head_dim * t, t * ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_pos_emb_head_dim)
    return a * (2 * m.qk + 2 * m.v_head_dim) * t, outside


def mla_matmuls(b: int, s: int, h: int, a: int, m: MLAShape) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) of each matmul: the linears per token, the core per (sequence, head, query)."""
    lin = tuple((b * s, o, i) for i, o in _linears(h, a, m))
    return lin + ((b * a * s, s, m.qk), (b * a * s, m.v_head_dim, s))
