"""Analytic LayerTables for tests (no torch, no trace): transformer shapes written out by hand.

Formulas follow Korthikanti et al. 2022 (§4, Table 2) and Narayanan et al. 2021 (Eq. 3) for a
GPT block with math attention, 16-bit activations and 1-byte dropout masks; per micro-batch of
``b`` sequences of ``s`` tokens, hidden ``h``, ``a`` heads, ffn ``f``, vocabulary ``V``:

    block params        4h² + 2hf + 9h + f                       (12h² + 13h for f = 4h)
    block fwd FLOPs     2bs(4h² + 2hf) + 4bs²h                   (24bsh²(1 + s/6h) for f = 4h)
    block bwd FLOPs     2 × fwd
    block saved bytes   18sbh + 4sbf + 5as²b                    (sbh(34 + 5as/h) for f = 4h)
      of which TP       8sbh + 4sbf + 5as²b                     (sbh(24 + 5as/h))
      attention core    5as²b
    embedding           V·h + s·h params, dropout mask sbh saved, output 2sbh
    head                2h params (+ Vh untied), 2bshV fwd FLOPs, saves 4sbh + 4sbV (fp32 logits,
                        vocab-parallel)

Also used by the search's tests. ``gpt_table`` takes kv_heads (grouped-query attention shrinks
the K/V projection), ``llama_table`` a SwiGLU / RMSNorm / no-dropout block.
"""
from __future__ import annotations

from costmodels.contracts.layer_table import LayerRow, LayerTable, TPPair


def gpt_table(layers: int, hidden: int, heads: int, vocab: int, seq: int, micro_batch: int = 1,
              ffn: int | None = None, kv_heads: int | None = None, tied: bool = True,
              model: str | None = None) -> LayerTable:
    h, a, s, b, V = hidden, heads, seq, micro_batch, vocab
    f = ffn or 4 * h
    kv = kv_heads or a
    qkv_out = h + 2 * h * kv // a
    sbh = s * b * h
    emb = LayerRow(name="embedding", kind="embedding", params=V * h + s * h, fwd_flops=0.0,
                   bwd_flops=0.0, saved_activation_bytes=sbh, act_tp_bytes=0,
                   act_attention_core_bytes=0, boundary_bytes=2 * sbh, tp_comm_bytes=2 * sbh)
    block_params = h * qkv_out + qkv_out + h * h + h + 2 * h * f + f + h + 4 * h
    fwd = 2.0 * b * s * (h * qkv_out + h * h + 2 * h * f) + 4.0 * b * s * s * h
    core = 5 * a * s * s * b
    saved = 18 * sbh + 4 * s * b * f + core
    act_tp = 8 * sbh + 4 * s * b * f + core
    d = h // a
    blocks = [LayerRow(
        name=f"blocks.{i}", kind="block", params=block_params, fwd_flops=fwd, bwd_flops=2 * fwd,
        saved_activation_bytes=saved, act_tp_bytes=act_tp, act_attention_core_bytes=core,
        boundary_bytes=2 * sbh,
        tp_pairs=(TPPair(column=("attn.c_attn",), row="attn.c_proj", heads=a, kv_heads=kv),
                  TPPair(column=("mlp.c_fc",), row="mlp.c_proj")),
        tp_comm_bytes=2 * sbh,
        matmul_dims=((b * s, qkv_out, h), (b * a * s, s, d), (b * a * s, d, s), (b * s, h, h),
                     (b * s, f, h), (b * s, h, f)))
        for i in range(layers)]
    head = LayerRow(name="head", kind="head", params=2 * h + (0 if tied else V * h),
                    fwd_flops=2.0 * b * s * h * V, bwd_flops=4.0 * b * s * h * V,
                    saved_activation_bytes=4 * sbh + 4 * s * b * V, act_tp_bytes=4 * s * b * V,
                    boundary_bytes=4 * b, tp_comm_bytes=2 * sbh,
                    tied_params=("embedding.wte.weight",) if tied else (),
                    matmul_dims=((b * s, V, h),))
    return LayerTable(model=model or f"gpt:layers={layers},hidden={h},heads={a},vocab={V},seq={s}",
                      micro_batch=b, seq=s, hidden=h, heads=a, kv_heads=kv, vocab=V, layers=layers,
                      act_dtype_bytes=2, rows=(emb, *blocks, head))


def llama_table(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq: int,
                micro_batch: int = 1, model: str | None = None) -> LayerTable:
    """SwiGLU MLP (w1, w3 column-parallel, w2 row-parallel), RMSNorm, RoPE, no dropout, untied."""
    h, a, kv, f, V, s, b = hidden, heads, kv_heads, ffn, vocab, seq, micro_batch
    qkv_out = h + 2 * h * kv // a
    sbh = s * b * h
    d = h // a
    emb = LayerRow(name="embedding", kind="embedding", params=V * h, fwd_flops=0.0, bwd_flops=0.0,
                   saved_activation_bytes=0, boundary_bytes=2 * sbh, tp_comm_bytes=2 * sbh)
    block_params = h * qkv_out + h * h + 3 * h * f + 2 * h
    fwd = 2.0 * b * s * (h * qkv_out + h * h + 3 * h * f) + 4.0 * b * s * s * h
    core = 2 * a * s * s * b                         # softmax output (no dropout)
    # norms 2·2sbh, qkv input 2sbh, q/k/v 2sbh + 4sbh·kv/a, proj input 2sbh, w1/w3 input 2sbh,
    # w1 and w3 outputs 2·2sbf, w2 input 2sbf
    act_tp = 2 * sbh + 4 * sbh * kv // a + 2 * sbh + 6 * s * b * f + core
    saved = act_tp + 8 * sbh
    blocks = [LayerRow(
        name=f"blocks.{i}", kind="block", params=block_params, fwd_flops=fwd, bwd_flops=2 * fwd,
        saved_activation_bytes=saved, act_tp_bytes=act_tp, act_attention_core_bytes=core,
        boundary_bytes=2 * sbh,
        tp_pairs=(TPPair(column=("attn.wq", "attn.wk", "attn.wv"), row="attn.wo", heads=a, kv_heads=kv),
                  TPPair(column=("mlp.w1", "mlp.w3"), row="mlp.w2")),
        tp_comm_bytes=2 * sbh,
        matmul_dims=((b * s, qkv_out, h), (b * a * s, s, d), (b * a * s, d, s), (b * s, h, h),
                     (b * s, 2 * f, h), (b * s, h, f)))
        for i in range(layers)]
    head = LayerRow(name="head", kind="head", params=h + V * h, fwd_flops=2.0 * b * s * h * V,
                    bwd_flops=4.0 * b * s * h * V, saved_activation_bytes=4 * sbh + 4 * s * b * V,
                    act_tp_bytes=4 * s * b * V, boundary_bytes=4 * b, tp_comm_bytes=2 * sbh,
                    matmul_dims=((b * s, V, h),))
    return LayerTable(model=model or f"llama:layers={layers},hidden={h},heads={a},kv_heads={kv},"
                      f"ffn={f},vocab={V},seq={s}", micro_batch=b, seq=s, hidden=h, heads=a,
                      kv_heads=kv, vocab=V, layers=layers, act_dtype_bytes=2, rows=(emb, *blocks, head))


# Shapes used across tests (Korthikanti et al. 2022, Table 3; Megatron GPT-3 175B; Llama 3)
KORTHIKANTI = {
    "22B": dict(layers=48, hidden=6144, heads=64, vocab=51200, seq=2048),
    "175B": dict(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048),
    "530B": dict(layers=105, hidden=20480, heads=128, vocab=51200, seq=2048),
    "1T": dict(layers=128, hidden=25600, heads=160, vocab=51200, seq=2048),
}


def gpt3_175b(seq: int = 2048, micro_batch: int = 1) -> LayerTable:
    return gpt_table(96, 12288, 96, 51200, seq, micro_batch, model="gpt3-175b")


def llama3_8b(seq: int = 8192) -> LayerTable:
    return llama_table(32, 4096, 32, 8, 14336, 128256, seq, model="llama3-8b")


def llama3_70b(seq: int = 8192) -> LayerTable:
    return llama_table(80, 8192, 64, 8, 28672, 128256, seq, model="llama3-70b")


def llama3_405b(seq: int = 8192) -> LayerTable:
    return llama_table(126, 16384, 128, 8, 53248, 128256, seq, model="llama3-405b")


def tiny_gpt(layers: int = 4, hidden: int = 64, heads: int = 4, vocab: int = 256, seq: int = 32) -> LayerTable:
    return gpt_table(layers, hidden, heads, vocab, seq, model=f"gpt:layers={layers},hidden={hidden},"
                     f"heads={heads},vocab={vocab},seq={seq}")


def no_host_runtime() -> str:
    """autopar's runtime without its host floor per block pass (``[host]``): the toy tables of
    the search tests are host-bound on a GPU profile under it (every block floored to the same
    time), which would test the floor, not the search they are about. Registered once; its name."""
    import dataclasses

    from costmodels.profiles.runtime import _REGISTERED, load_runtime, register_runtime
    if "autopar-no-host" not in _REGISTERED:
        register_runtime(dataclasses.replace(load_runtime("autopar"), name="autopar-no-host", host_block_s=0.0))
    return "autopar-no-host"


def no_torch_pipelining_runtime() -> str:
    """autopar's runtime priced as before its pipelined ZeRO-2/3 was measured (``torch_pipelining
    = 0``: ZeRO Table 1's sharded gradients under pp, no held outputs on the last stage) and
    before it reduce-scattered every micro-batch under pp (``pipeline_zero_reduce_per_micro_batch
    = 0``: one reduce-scatter a step, where ZeRO-2 under pp is cheap enough to compete). For the
    tests of mechanisms that a pp configuration happens to carry: the gpt3-175b solver tests need
    dp128·tp2·pp4 ZeRO-2 to fit with uneven splits (the measured runtime, holding whole fp32
    gradients per stage, no longer fits it), the coefficient test checks Table 1's formula, and
    the memory-floor / V-placement tests count in-flight activations, which the last stage's held
    outputs would blur. Registered once; its name."""
    import dataclasses

    from costmodels.profiles.runtime import _REGISTERED, load_runtime, register_runtime
    if "autopar-no-torch-pipelining" not in _REGISTERED:
        register_runtime(dataclasses.replace(load_runtime("autopar"), name="autopar-no-torch-pipelining",
                                             torch_pipelining=0, pipeline_zero_reduce_per_micro_batch=0))
    return "autopar-no-torch-pipelining"


def tight_memory_costs(layers: int, batch: int, fraction: float):
    """Search costs of a tiny GPT on an A100 whose HBM is ``fraction`` of the serial model's
    memory: tight enough that memory decides the splits (the memory-floor and fit-check tests)."""
    import dataclasses

    from autopar.search.costs import Costs
    from costmodels.contracts.plan import Plan
    from costmodels.model.estimate import estimate
    from costmodels.profiles.hardware_files import load_profile
    base = load_profile("a100-80g-sxm")
    t = gpt_table(layers, 64, 4, 256, 64, model=f"gpt:layers={layers},hidden=64,heads=4,vocab=256,seq=64")
    serial = estimate(t, dataclasses.replace(base, hbm_bytes=1e15), Plan(), 1, batch).memory_bytes["total"]
    prof = dataclasses.replace(base, name="tiny-test", hbm_bytes=fraction * serial, memory_reserve_bytes=1000.0)
    return Costs(t, prof, batch)
