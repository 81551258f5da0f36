"""GPT (GPT-2 / Megatron GPT-3): learned positions, pre-LayerNorm, GeLU MLP, tied head.

Rows for the planner: ``embedding`` (token + position), ``blocks.i``, ``head`` (final
LayerNorm + output projection). Parameters per block are 12h² + 13h, so the whole model is
Megatron's 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) plus the final LayerNorm.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from autopar.models.config import ModelConfig
from autopar.models.layers import PreNormBlock, init_weights


class GPTEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq: int, dropout: float):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))


class LMHead(nn.Module):
    """Final norm and projection to the vocabulary (logits; the loss stays outside)."""

    def __init__(self, norm: nn.Module, hidden: int, vocab: int, bias: bool = False):
        super().__init__()
        self.ln_f = norm
        self.lm_head = nn.Linear(hidden, vocab, bias=bias)

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str = "math"):
        super().__init__()
        self.config = cfg
        self.embedding = GPTEmbedding(cfg.vocab, cfg.hidden, cfg.seq, cfg.dropout)
        self.blocks = nn.ModuleList(
            PreNormBlock(cfg.hidden, cfg.heads, cfg.ffn_dim, cfg.seq, cfg.dropout, True, attention)
            for _ in range(cfg.layers))
        self.head = LMHead(nn.LayerNorm(cfg.hidden), cfg.hidden, cfg.vocab)
        init_weights(self)
        if cfg.tied:
            self.head.lm_head.weight = self.embedding.wte.weight

    def forward(self, idx):
        x = self.embedding(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
