"""Encoder presets: BERT (post-LayerNorm, masked-LM head tied to the word embedding) and ViT
(patch embedding, class token, pre-LayerNorm blocks, classification head), plus a residual MLP
stack (``mlp:``) for the simplest non-attention case.

Rows: ``embedding``, ``blocks.i``, ``head`` for all three.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from autopar.models.config import ModelConfig
from autopar.models.layers import GeluMLP, PreNormBlock, SelfAttention, init_weights


class BertEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab, cfg.hidden)
        self.position = nn.Embedding(cfg.seq, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.ln = nn.LayerNorm(cfg.hidden, eps=1e-12)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.word(idx) + self.position(pos) + self.token_type.weight[0]
        return self.drop(self.ln(x))


class PostNormBlock(nn.Module):
    """BERT block: ln(x + attn(x)); ln(x + mlp(x))."""

    def __init__(self, cfg: ModelConfig, attention: str):
        super().__init__()
        self.attn = SelfAttention(cfg.hidden, cfg.heads, cfg.seq, cfg.dropout, False, attention)
        self.ln_1 = nn.LayerNorm(cfg.hidden, eps=1e-12)
        self.mlp = GeluMLP(cfg.hidden, cfg.ffn_dim, cfg.dropout)
        self.ln_2 = nn.LayerNorm(cfg.hidden, eps=1e-12)

    def forward(self, x):
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class MaskedLMHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.gelu = nn.GELU()
        self.ln = nn.LayerNorm(cfg.hidden, eps=1e-12)
        self.decoder = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, x):
        return self.decoder(self.ln(self.gelu(self.dense(x))))


class Bert(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str = "math"):
        super().__init__()
        self.config = cfg
        self.embedding = BertEmbedding(cfg)
        self.blocks = nn.ModuleList(PostNormBlock(cfg, attention) for _ in range(cfg.layers))
        self.head = MaskedLMHead(cfg)
        init_weights(self)
        self.head.decoder.weight = self.embedding.word.weight

    def forward(self, idx):
        x = self.embedding(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class PatchEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        n = (cfg.image // cfg.patch) ** 2
        self.proj = nn.Conv2d(cfg.channels, cfg.hidden, kernel_size=cfg.patch, stride=cfg.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.hidden))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, cfg.hidden))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, images):
        x = self.proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1)
        return self.drop(x + self.pos)


class ClassifierHead(nn.Module):
    def __init__(self, hidden: int, classes: int, pool_first: bool):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, classes)
        self.pool_first = pool_first

    def forward(self, x):
        if self.pool_first:
            x = x[:, 0]
        return self.fc(self.ln(x))


class ViT(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str = "math"):
        super().__init__()
        self.config = cfg
        t = cfg.tokens_per_sample
        self.embedding = PatchEmbedding(cfg)
        self.blocks = nn.ModuleList(
            PreNormBlock(cfg.hidden, cfg.heads, cfg.ffn_dim, t, cfg.dropout, False, attention)
            for _ in range(cfg.layers))
        self.head = ClassifierHead(cfg.hidden, cfg.classes, pool_first=True)
        init_weights(self)

    def forward(self, images):
        x = self.embedding(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ResidualMLPBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.mlp = GeluMLP(cfg.hidden, cfg.ffn_dim, cfg.dropout)

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class InputProjection(nn.Module):
    def __init__(self, in_features: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(in_features, hidden)

    def forward(self, x):
        return self.proj(x)


class MLP(nn.Module):
    """Residual MLP stack on (B, seq, in_features) inputs, classifying every position."""

    def __init__(self, cfg: ModelConfig, attention: str = "math"):
        super().__init__()
        self.config = cfg
        self.embedding = InputProjection(cfg.in_features or cfg.hidden, cfg.hidden)
        self.blocks = nn.ModuleList(ResidualMLPBlock(cfg) for _ in range(cfg.layers))
        self.head = ClassifierHead(cfg.hidden, cfg.classes, pool_first=False)
        init_weights(self)

    def forward(self, x):
        x = self.embedding(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
