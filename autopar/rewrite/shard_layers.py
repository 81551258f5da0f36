"""The layers a tensor-parallel row is rebuilt from, and how their weights are cut.

The rewrite (``autopar.rewrite.tp``) replaces a serial ``nn.Linear`` / ``nn.Embedding`` /
``nn.Dropout`` by one of these when its tensor is split over tp ranks; each sharded parameter is
recorded as a :class:`ShardSpec` so ``gather_row_state_dict`` can rebuild the serial state dict.
Kept apart from the graph passes because they are plain modules: the runtime executes them and
``autopar apply --emit`` prints their names.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ShardSpec:
    """How a local tensor relates to the original row's: ``name`` there, the sharded ``dim``
    (None = replicated) and, for a fused tensor (qkv), the full ``segments`` sizes along ``dim``
    (each segment is split in tp contiguous blocks; the local tensor concatenates own blocks)."""
    name: str
    dim: int | None = None
    segments: tuple[int, ...] | None = None


class ColumnParallelLinear(nn.Linear):
    """This rank's output features of a column-parallel linear (input replicated)."""


class RowParallelLinear(nn.Linear):
    """This rank's input features of a row-parallel linear. ``forward`` leaves the bias out: the
    graph adds it once, after the tensor-parallel reduction."""

    def forward(self, x):
        return F.linear(x, self.weight)


class ColumnParallelConv1D(nn.Module):
    """transformers' ``Conv1D`` (GPT-2: ``y = x @ W + b`` with ``W`` of shape (in, out)) holding
    this rank's output features: ``W``'s columns and ``b``'s entries."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x):
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


class RowParallelConv1D(nn.Module):
    """``Conv1D`` holding this rank's input features (``W``'s rows); the bias is left out and
    added once after the reduction, as ``RowParallelLinear`` does."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x):
        return x @ self.weight


def is_conv1d(mod: nn.Module) -> bool:
    """transformers' ``Conv1D``: a linear whose weight is stored (in, out)."""
    return type(mod).__name__ == "Conv1D" and hasattr(mod, "nf")


def out_features(mod: nn.Module) -> int:
    return mod.nf if is_conv1d(mod) else mod.out_features


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``[vocab_start, vocab_end)`` of the embedding table; ids outside give zeros (the
    graph all-reduces the result over tp). The serial table's ``padding_idx`` row (BERT's pad
    token) gets no gradient here either, when this rank holds it."""

    def __init__(self, num_embeddings, embedding_dim, vocab_start, vocab_end, serial_padding_idx=None, **kw):
        super().__init__(num_embeddings, embedding_dim, **kw)
        self.vocab_start, self.vocab_end = vocab_start, vocab_end
        pad = serial_padding_idx
        self.local_padding_idx = pad - vocab_start if pad is not None and vocab_start <= pad < vocab_end else None

    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight, padding_idx=self.local_padding_idx)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)

    def extra_repr(self):
        return f"{super().extra_repr()}, vocab=[{self.vocab_start}, {self.vocab_end})"


def sharded_dropout(x, p: float, training: bool, dim: int, tp: int, rank: int):
    """Dropout of this rank's shard (split on ``dim``) with the serial model's mask: the mask is
    drawn for the full tensor (every tp rank draws the same numbers from the same RNG state, as
    ``F.dropout`` would on the serial tensor on CPU) and this rank's slice is applied."""
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    shape = list(x.shape)
    shape[dim] *= tp
    noise = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(1 - p)
    noise = noise.narrow(dim, rank * x.shape[dim], x.shape[dim]).div_(1 - p)
    return x * noise


class ShardedDropout(nn.Dropout):
    """nn.Dropout on a tensor split on ``dim`` over tp ranks; masks equal the serial model's."""

    def __init__(self, p, dim, tp, rank, inplace=False):
        super().__init__(p, inplace)
        self.dim, self.tp, self.rank = dim, tp, rank

    def forward(self, x):
        return sharded_dropout(x, self.p, self.training, self.dim, self.tp, self.rank)

    def extra_repr(self):
        return f"p={self.p}, split dim={self.dim}, tp rank {self.rank} of {self.tp} (serial mask)"


# ---- cutting weights ------------------------------------------------------------------------------

def as_param(t: torch.Tensor, like: torch.Tensor | None = None) -> nn.Parameter:
    """A fresh parameter holding a copy of ``t``, trainable iff ``like`` (default ``t``) is."""
    src = t if like is None else like
    return nn.Parameter(t.detach().clone(), requires_grad=src.requires_grad)


def shard_rows(t: torch.Tensor, segments, rank, tp) -> torch.Tensor:
    """This rank's rows of ``t``: each segment (q, k, v of a fused qkv) cut in tp blocks."""
    parts = t.split(list(segments), dim=0)
    return torch.cat([p.chunk(tp, dim=0)[rank] for p in parts], dim=0).detach().clone()


def column_parallel(mod: nn.Linear, name: str, segments, rank: int, tp: int):
    """(ColumnParallelLinear, {param: ShardSpec}) holding this rank's output features of ``mod``
    (a fused output is cut per segment)."""
    seg = tuple(segments) if len(segments) > 1 else None
    if is_conv1d(mod):   # (in, out): the output features are the weight's columns
        w = shard_rows(mod.weight.t(), segments, rank, tp).t().contiguous()
        b = as_param(shard_rows(mod.bias, segments, rank, tp), mod.bias) if mod.bias is not None else None
        return (ColumnParallelConv1D(as_param(w, mod.weight), b),
                {"weight": ShardSpec(f"{name}.weight", 1, seg), "bias": ShardSpec(f"{name}.bias", 0, seg)})
    lin = ColumnParallelLinear(mod.in_features, mod.out_features // tp, bias=mod.bias is not None,
                               device="meta", dtype=mod.weight.dtype)
    lin.weight = as_param(shard_rows(mod.weight, segments, rank, tp), mod.weight)
    if mod.bias is not None:
        lin.bias = as_param(shard_rows(mod.bias, segments, rank, tp), mod.bias)
    return lin, {"weight": ShardSpec(f"{name}.weight", 0, seg), "bias": ShardSpec(f"{name}.bias", 0, seg)}


def row_parallel(mod: nn.Linear, name: str, rank: int, tp: int):
    """(RowParallelLinear, {param: ShardSpec}) holding this rank's input features of ``mod``; the
    bias stays whole (added once after the reduction)."""
    if is_conv1d(mod):   # (in, out): the input features are the weight's rows
        b = as_param(mod.bias) if mod.bias is not None else None
        return (RowParallelConv1D(as_param(mod.weight.chunk(tp, dim=0)[rank], mod.weight), b),
                {"weight": ShardSpec(f"{name}.weight", 0)})
    lin = RowParallelLinear(mod.in_features // tp, mod.out_features, bias=mod.bias is not None,
                            device="meta", dtype=mod.weight.dtype)
    lin.weight = as_param(mod.weight.chunk(tp, dim=1)[rank], mod.weight)
    if mod.bias is not None:
        lin.bias = as_param(mod.bias)
    return lin, {"weight": ShardSpec(f"{name}.weight", 1)}


def vocab_parallel(mod: nn.Embedding, name: str, rank: int, tp: int):
    """(VocabParallelEmbedding, {param: ShardSpec}) holding this rank's rows of the table."""
    per = mod.num_embeddings // tp
    start = rank * per
    emb = VocabParallelEmbedding(per, mod.embedding_dim, start, start + per, device="meta",
                                 dtype=mod.weight.dtype, serial_padding_idx=mod.padding_idx)
    emb.weight = as_param(mod.weight[start:start + per], mod.weight)
    return emb, {"weight": ShardSpec(f"{name}.weight", 0)}
