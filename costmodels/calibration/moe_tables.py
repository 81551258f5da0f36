"""Analytic layer tables of Mixture-of-Experts transformers (no torch, no trace), for the open
MoE runs (``moe_runs.csv``) and the tests: what ``autopar inspect`` measures for the ``moe``
family (autopar/models/moe.py), written out.

Llama-shaped blocks (GQA attention, RMSNorm, SwiGLU); with ``b`` sequences of ``s`` tokens,
hidden ``h``, ``E`` routed experts of width ``f_e``, ``k`` per token, ``S`` shared experts,
16-bit activations, flash attention's saved bytes as the llama table of the tests counts them::

    MoE block params     attention + h·E (router) + 3·h·f_e·(E + S)
    MoE block fwd FLOPs  attention + 2bs·h·E + 2bs·3h·f_e·(k + S)
    saved bytes          attention + 2bs·E·4 (router softmax, fp32) + 2·bs·k·(h + 3f_e) (the
                         dispatched tokens and the experts' inner activations) + shared's
    matmuls              one (bs·k/E, f_e, h)×2 + (bs·k/E, h, f_e) triple per expert: the grouped
                         GEMM at balanced routing and ep = 1 (costmodels.model.experts reprices it
                         at the plan's ep)

``moe_layers`` < ``layers − dense_layers`` spreads the MoE blocks as Megatron's
``--moe-layer-freq`` does (the remaining blocks dense, at ``ffn``).

``mla`` (a ``costmodels.calibration.mla.MLAShape``) makes every block's attention DeepSeek's
Multi-head Latent Attention instead of GQA (its parameters, FLOPs, saved bytes and matmuls,
``mla.py``); ``mla_up_proj_recompute`` prices Megatron-core's selective recompute of its
up-projections (``--recompute-modules mla_up_proj``): their outputs not kept, their forward
run again in the backward (``bwd_flops``; the weight-gradient part stays the forward's FLOPs).
"""
from __future__ import annotations

from costmodels.calibration.mla import (
    MLAShape,
    mla_fwd_flops,
    mla_matmuls,
    mla_params,
    mla_saved_bytes,
    up_proj_recompute_flops,
)
from costmodels.contracts.layer_table import LayerRow, LayerTable, TPPair


def moe_table(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq: int,
              experts: int, top_k: int, expert_ffn: int, shared: int = 0, dense_layers: int = 0,
              moe_layers: int | None = None, micro_batch: int = 1, model: str | None = None,
              mla: MLAShape | None = None, mla_up_proj_recompute: bool = False) -> LayerTable:
    h, a, kv, V, s, b = hidden, heads, kv_heads or heads, vocab, seq, micro_batch
    E, k, fe = experts, top_k, expert_ffn
    qkv_out = h + 2 * h * kv // a
    sbh = s * b * h
    d = h // a
    n_moe = layers - dense_layers if moe_layers is None else moe_layers
    attn_params = h * qkv_out + h * h + 2 * h
    attn_fwd = 2.0 * b * s * (h * qkv_out + h * h) + 4.0 * b * s * s * h
    core = 2 * a * s * s * b
    attn_tp = 2 * sbh + 4 * sbh * kv // a + 2 * sbh + core
    attn_mm = ((b * s, qkv_out, h), (b * a * s, s, d), (b * a * s, d, s), (b * s, h, h))
    attn_pair = TPPair(column=("attn.wq", "attn.wk", "attn.wv"), row="attn.wo", heads=a, kv_heads=kv)
    attn_outside, attn_bwd_extra = 0, 0.0   # MLA's compressed q / kv kept; its up-projections' recompute
    if mla is not None:   # Multi-head Latent Attention (costmodels.calibration.mla)
        attn_params = mla_params(h, a, mla) + 2 * h
        attn_fwd = mla_fwd_flops(b, s, h, a, mla)
        mla_tp, attn_outside = mla_saved_bytes(b, s, a, mla, mla_up_proj_recompute)
        attn_tp = mla_tp + core
        attn_mm = mla_matmuls(b, s, h, a, mla)
        attn_pair = TPPair(column=("attn.q_up", "attn.kv_up"), row="attn.proj", heads=a, kv_heads=a)
        attn_bwd_extra = up_proj_recompute_flops(b, s, h, a, mla) if mla_up_proj_recompute else 0.0
    wgt = (lambda fwd: fwd) if attn_bwd_extra else (lambda fwd: None)   # W part: the forward's FLOPs

    def dense_row(i):
        fwd = attn_fwd + 6.0 * b * s * h * ffn
        act_tp = attn_tp + 6 * s * b * ffn
        return LayerRow(name=f"blocks.{i}", kind="block", params=attn_params + 3 * h * ffn,
                        fwd_flops=fwd, bwd_flops=2 * fwd + attn_bwd_extra, bwd_weight_flops=wgt(fwd),
                        saved_activation_bytes=act_tp + 8 * sbh + attn_outside,
                        act_tp_bytes=act_tp, act_attention_core_bytes=core, boundary_bytes=2 * sbh,
                        tp_pairs=(attn_pair, TPPair(column=("mlp.w1", "mlp.w3"), row="mlp.w2")),
                        tp_comm_bytes=2 * sbh,
                        matmul_dims=attn_mm + ((b * s, 2 * ffn, h), (b * s, h, ffn)))

    def moe_row(i):
        routed = b * s * k
        tau = max(1, routed // E)
        expert_fwd = 6.0 * routed * h * fe
        fwd = attn_fwd + 2.0 * b * s * h * E + expert_fwd + 6.0 * b * s * h * fe * shared
        shared_tp = 6 * s * b * fe * shared
        saved = attn_tp + shared_tp + 8 * sbh + 8 * b * s * E + 2 * routed * (h + 3 * fe) + attn_outside
        pairs = (attn_pair,) + ((TPPair(column=("mlp.shared.w1", "mlp.shared.w3"), row="mlp.shared.w2"),)
                                if shared else ())
        mm = attn_mm + ((b * s, E, h),) + ((tau, fe, h), (tau, fe, h), (tau, h, fe)) * E
        if shared:
            mm += ((b * s, 2 * fe * shared, h), (b * s, h, fe * shared))
        return LayerRow(name=f"blocks.{i}", kind="block",
                        params=attn_params + h * E + 3 * h * fe * (E + shared),
                        fwd_flops=fwd, bwd_flops=2 * fwd + attn_bwd_extra, bwd_weight_flops=wgt(fwd),
                        saved_activation_bytes=saved,
                        act_tp_bytes=attn_tp + shared_tp, act_attention_core_bytes=core,
                        boundary_bytes=2 * sbh, tp_pairs=pairs, tp_comm_bytes=2 * sbh,
                        matmul_dims=mm, expert_params=3 * h * fe * E, experts=E,
                        routed_tokens=routed, dispatch_bytes=2 * routed * h,
                        expert_fwd_flops=expert_fwd)

    sparse = layers - dense_layers
    moe_at = set()
    if n_moe > 0:   # spread n_moe MoE blocks evenly over the non-dense ones
        moe_at = {dense_layers + (j * sparse) // n_moe for j in range(n_moe)}
    emb = LayerRow(name="embedding", kind="embedding", params=V * h, fwd_flops=0.0, bwd_flops=0.0,
                   saved_activation_bytes=0, boundary_bytes=2 * sbh, tp_comm_bytes=2 * sbh)
    blocks = [moe_row(i) if i in moe_at else dense_row(i) for i in range(layers)]
    head = LayerRow(name="head", kind="head", params=h + V * h, fwd_flops=2.0 * b * s * h * V,
                    bwd_flops=4.0 * b * s * h * V, saved_activation_bytes=4 * sbh + 4 * s * b * V,
                    act_tp_bytes=4 * s * b * V, boundary_bytes=4 * b, tp_comm_bytes=2 * sbh,
                    matmul_dims=((b * s, V, h),))
    name = model or (f"moe:layers={layers},hidden={h},heads={a},kv_heads={kv},ffn={ffn},vocab={V},"
                     f"seq={s},experts={E},top_k={k},expert_ffn={fe},shared_experts={shared},"
                     f"dense_layers={dense_layers}" + (f",mla={mla.q_lora_rank}/{mla.kv_lora_rank}" if mla else ""))
    return LayerTable(model=name, micro_batch=b, seq=s, hidden=h, heads=a, kv_heads=kv, vocab=V,
                      layers=layers, act_dtype_bytes=2, rows=(emb, *blocks, head))
