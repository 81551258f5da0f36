"""Building blocks shared by the preset models: attention and MLPs, written nanoGPT-style.

They are deliberately plain: ``x.view(B, T, self.n_head, C // self.n_head)``,
``qkv.split(C, dim=2)``, explicit softmax attention. The tensor-parallel rewrite works on this
style of code (it rewrites head counts and split sizes in the traced graph), so a user's own
nanoGPT-like model is handled the same way as these.

``attention="math"`` materialises the scores (what Korthikanti et al. count); ``"flash"`` calls
``F.scaled_dot_product_attention`` (fused, no s² activations).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection (GPT / BERT / ViT)."""

    def __init__(self, hidden: int, heads: int, seq: int, dropout: float = 0.0,
                 causal: bool = True, attention: str = "math"):
        super().__init__()
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = heads
        self.dropout = dropout
        self.causal = causal
        self.attention = attention
        if causal and attention == "math":
            self.register_buffer("bias", causal_mask(seq), persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = attend(self, q, k, v, T)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def causal_mask(seq: int) -> torch.Tensor:
    """(1, 1, seq, seq) lower-triangular ones on the default device. On ``meta`` there are no
    values to compute (and ``torch.tril`` there costs milliseconds per module), so only the
    shape is made."""
    if torch.get_default_device().type == "meta":
        return torch.empty(1, 1, seq, seq)
    return torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq)


def attend(mod: nn.Module, q, k, v, T):
    """softmax(q kᵀ / √d) v, materialised ("math") or fused ("flash")."""
    if mod.attention == "flash":
        p = mod.dropout if mod.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=mod.causal)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if mod.causal:
        att = att.masked_fill(mod.bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    att = mod.attn_dropout(att)
    return att @ v


class GeluMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, dropout: float = 0.0):
        super().__init__()
        self.c_fc = nn.Linear(hidden, ffn)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(ffn, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class PreNormBlock(nn.Module):
    """GPT-2 / ViT block: x + attn(ln(x)); x + mlp(ln(x))."""

    def __init__(self, hidden, heads, ffn, seq, dropout, causal, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads, seq, dropout, causal, attention)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = GeluMLP(hidden, ffn, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style init (normal(0, 0.02), zero biases); deterministic under a fixed seed."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)
