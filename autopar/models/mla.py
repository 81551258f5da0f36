"""Multi-head Latent Attention (DeepSeek-V2/V3), the ``moe`` family's attention when
``kv_lora_rank`` is set: low-rank query and key/value projections, a RoPE part of the query and
a RoPE key shared by the heads, query-key heads ``qk_nope_head_dim + qk_rope_head_dim`` wide and
value heads ``v_head_dim`` wide (transformers' ``DeepseekV3Attention``; Megatron-core's
``MLASelfAttention``; the cost model's analytic form: ``costmodels/calibration/mla.py``)::

    q = wq_b(q_norm(wq_a(x)))          (wq: h → a·d_qk when q_lora_rank is not set)
    c, k_pe = split(wkv_a(x), [r_kv, d_r])
    k_nope, v = split(wkv_b(kv_norm(c)), [d_n, d_v])        per head
    q_pe, k_pe rotated (RoPE over d_r); k = [k_nope, k_pe broadcast]; o = wo(attention(q, k, v))

Tensor parallelism is not offered for it: the key's RoPE part comes out of the same projection
(``wkv_a``) as the latent that feeds ``wkv_b``, so the rewrite finds no Megatron pair to shard;
autopar's runtime refuses MLA under tp before launch (``check_mla_plan``).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from autopar.models.config import ModelConfig
from autopar.models.layers import attend, causal_mask
from autopar.models.llama import RMSNorm, apply_rope, rope_tables
from costmodels.contracts.errors import PlanError, SpecError


def uses_mla(cfg: ModelConfig) -> bool:
    return bool(getattr(cfg, "kv_lora_rank", 0))


def check_mla_config(cfg: ModelConfig) -> None:
    """The MLA widths together (one SpecError line)."""
    if not uses_mla(cfg):
        given = [k for k in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
                 if getattr(cfg, k)]
        if given:
            raise SpecError(f"{', '.join(given)} set without kv_lora_rank; Multi-head Latent Attention "
                            "needs kv_lora_rank (e.g. kv_lora_rank=512) or leave them out")
        return
    missing = [k for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if not getattr(cfg, k)]
    if missing:
        raise SpecError(f"kv_lora_rank={cfg.kv_lora_rank} (Multi-head Latent Attention) needs "
                        f"{', '.join(missing)}; e.g. DeepSeek-V3's qk_nope_head_dim=128,"
                        "qk_rope_head_dim=64,v_head_dim=128")
    if cfg.qk_rope_head_dim % 2:
        raise SpecError(f"qk_rope_head_dim={cfg.qk_rope_head_dim} must be even (RoPE rotates pairs)")


def check_mla_plan(where: str, tp: int) -> None:
    """autopar's runtime: MLA runs without tensor parallelism (module docstring); ``where``: the
    module's path (``autopar.runtime.assemble.tp_modules``)."""
    if tp > 1:
        raise PlanError(f"plan field 'tp'={tp}: {where} is Multi-head Latent Attention, which autopar's "
                        "tensor-parallel rewrite does not shard (its RoPE key and latent share one "
                        "projection); use tp=1 (dp, ep, ZeRO and pp run it)")


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str):
        super().__init__()
        h, a = cfg.hidden, cfg.heads
        self.d_n, self.d_r, self.d_v, self.r_kv = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                                   cfg.v_head_dim, cfg.kv_lora_rank)
        d_qk = self.d_n + self.d_r
        if cfg.q_lora_rank:
            self.wq_a = nn.Linear(h, cfg.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.wq_b = nn.Linear(cfg.q_lora_rank, a * d_qk, bias=False)
        else:
            self.wq = nn.Linear(h, a * d_qk, bias=False)
        self.wkv_a = nn.Linear(h, self.r_kv + self.d_r, bias=False)
        self.kv_norm = RMSNorm(self.r_kv, cfg.norm_eps)
        self.wkv_b = nn.Linear(self.r_kv, a * (self.d_n + self.d_v), bias=False)
        self.wo = nn.Linear(a * self.d_v, h, bias=False)
        self.n_head, self.head_dim = a, d_qk
        self.attention, self.causal, self.dropout = attention, True, 0.0
        self.attn_dropout = nn.Identity()
        cos, sin = rope_tables(cfg.seq, self.d_r, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        if attention == "math":
            self.register_buffer("bias", causal_mask(cfg.seq), persistent=False)

    def forward(self, x):
        B, T, _ = x.size()
        a = self.n_head
        q = self.wq_b(self.q_norm(self.wq_a(x))) if hasattr(self, "wq_a") else self.wq(x)
        q = q.view(B, T, a, self.d_n + self.d_r)
        q_nope, q_pe = torch.split(q, [self.d_n, self.d_r], dim=-1)
        c, k_pe = torch.split(self.wkv_a(x), [self.r_kv, self.d_r], dim=-1)
        kv = self.wkv_b(self.kv_norm(c)).view(B, T, a, self.d_n + self.d_v)
        k_nope, v = torch.split(kv, [self.d_n, self.d_v], dim=-1)
        q_pe = apply_rope(q_pe, self.cos[:T], self.sin[:T])
        k_pe = apply_rope(k_pe.view(B, T, 1, self.d_r), self.cos[:T], self.sin[:T])
        q = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_pe.expand(B, T, a, self.d_r)], dim=-1).transpose(1, 2)
        y = attend(self, q, k, v.transpose(1, 2), T)
        return self.wo(y.transpose(1, 2).contiguous().view(B, T, a * self.d_v))
