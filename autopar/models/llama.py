"""Llama 3: RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, untied head.

Rows: ``embedding``, ``blocks.i``, ``head``. Per block: 2·h·(heads + kv_heads)·d + 3·h·ffn + 2h
parameters (d = head dim). RoPE tables are non-persistent buffers of every attention module, so a
pipeline stage carries what it needs.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.models.config import ModelConfig
from autopar.models.gpt import LMHead
from autopar.models.layers import attend, causal_mask, init_weights


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@functools.lru_cache(maxsize=8)
def _rope_tables_cpu(seq: int, head_dim: int, theta: float):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device="cpu"), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rope_tables(seq: int, head_dim: int, theta: float):
    """cos and sin tables (seq, head_dim) on the default device (computed once on CPU: on
    ``meta`` the same arithmetic would cost milliseconds per module for no values)."""
    cos, sin = _rope_tables_cpu(seq, head_dim, theta)
    device = torch.get_default_device()
    if device.type == "cpu":
        return cos.clone(), sin.clone()
    return cos.to(device), sin.to(device)


def apply_rope(x, cos, sin):
    """x: (B, T, H, D); cos/sin: (T, D). Rotates pairs (i, i + D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


class GQAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str):
        super().__init__()
        d = cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.heads * d, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.n_kv_heads * d, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.n_kv_heads * d, bias=False)
        self.wo = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)
        self.n_head, self.n_kv_head, self.head_dim = cfg.heads, cfg.n_kv_heads, d
        self.attention, self.causal, self.dropout = attention, True, 0.0
        self.attn_dropout = nn.Identity()
        cos, sin = rope_tables(cfg.seq, d, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        if attention == "math":
            self.register_buffer("bias", causal_mask(cfg.seq), persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q = self.wq(x).view(B, T, self.n_head, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim)
        q = apply_rope(q, self.cos[:T], self.sin[:T]).transpose(1, 2)
        k = apply_rope(k, self.cos[:T], self.sin[:T]).transpose(1, 2)
        v = v.transpose(1, 2)
        k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        y = attend(self, q, k, v, T)
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_head * self.head_dim)
        return self.wo(y)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = GQAttention(cfg, attention)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.ffn_dim)

    def forward(self, x):
        x = x + self.attn(self.attention_norm(x))
        return x + self.mlp(self.ffn_norm(x))


class TokenEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)

    def forward(self, idx):
        return self.tok(idx)


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str = "math"):
        super().__init__()
        self.config = cfg
        self.embedding = TokenEmbedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(self._block(cfg, attention, i) for i in range(cfg.layers))
        self.head = LMHead(RMSNorm(cfg.hidden, cfg.norm_eps), cfg.hidden, cfg.vocab)
        init_weights(self)
        if cfg.tied:
            self.head.lm_head.weight = self.embedding.tok.weight

    def _block(self, cfg: ModelConfig, attention: str, index: int) -> nn.Module:
        """Block ``index`` of the stack (a subclass swaps the block: ``autopar.models.moe.MoE``)."""
        return LlamaBlock(cfg, attention)

    def forward(self, idx):
        x = self.embedding(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
