"""Autograd-aware tensor-parallel collectives, Megatron-core style.

Each collective is a tiny ``torch.autograd.Function`` wrapped in a leaf ``nn.Module`` so that it
shows up by name in a rewritten row's fx code (``self.attn_c_proj_reduce(c_proj)``) and in
``autopar apply --emit``'s summary. All of them run on the tensor-parallel group only.

==================  =====================================  ==========================================
module              forward                                backward
==================  =====================================  ==========================================
CopyToTP            identity                               all-reduce (sum)
ReduceFromTP        all-reduce (sum)                       identity
GatherSeq           all-gather along dim 1 (sequence)      reduce-scatter along dim 1 (``grad="reduce_scatter"``)
                                                           or keep own chunk (``grad="split"``)
ReduceScatterSeq    reduce-scatter along dim 1             all-gather along dim 1
ScatterSeq          keep own chunk of dim 1                all-gather along dim 1
GatherLastDim       all-gather along the last dim          keep own chunk of the last dim
==================  =====================================  ==========================================

With a :class:`FakeGroup` (used to rewrite and emit code without a process group) the collectives
only reproduce the *shapes* of their results locally (all-gather = concatenate ``size`` copies,
reduce-scatter = own chunk), which is all shape propagation and code emission need.
gloo lacks reduce-scatter / all-gather-into-tensor on some builds, so on non-NCCL groups those are
done with all-reduce + chunk and list all-gather.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["FakeGroup", "CopyToTP", "ReduceFromTP", "GatherSeq", "ReduceScatterSeq", "ScatterSeq",
           "GatherLastDim", "COLLECTIVES", "group_rank", "group_size", "all_gather_along_dim",
           "reduce_scatter_along_dim"]


class FakeGroup:
    """Stands in for a process group of ``size`` ranks, seen from ``rank``: no communication."""

    def __init__(self, rank: int = 0, size: int = 1):
        self._rank, self._size = int(rank), int(size)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def __repr__(self):
        return f"FakeGroup(rank={self._rank}, size={self._size})"


def _fake(group) -> bool:
    return isinstance(group, FakeGroup)


def group_size(group) -> int:
    if group is None:
        return 1
    if _fake(group):
        return group.size()
    return dist.get_world_size(group)


def group_rank(group) -> int:
    if group is None:
        return 0
    if _fake(group):
        return group.rank()
    return dist.get_rank(group)


def _nccl(group) -> bool:
    try:
        return dist.get_backend(group) == "nccl"
    except Exception:
        return False


# ---- raw (non-autograd) collectives ---------------------------------------------------------------

def _all_reduce(x, group):
    if _fake(group) or group_size(group) == 1 or x.is_meta:
        return x
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


def all_gather_along_dim(x, dim, group):
    """The ``group``'s shards of ``x`` concatenated along ``dim``, no autograd: the all-gather
    the rewritten rows run (NCCL's into-tensor call on dim 0, else a list all-gather and
    ``cat``, copies included). Public so that ``autopar profile`` times this very call."""
    n = group_size(group)
    if n == 1:
        return x
    if _fake(group) or x.is_meta:
        return torch.cat([x] * n, dim=dim)
    x = x.contiguous()
    if _nccl(group) and dim == 0:
        out = torch.empty((x.shape[0] * n,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=group)
        return out
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def _split(x, dim, group):
    n = group_size(group)
    if n == 1:
        return x
    size = x.shape[dim]
    if size % n:
        from costmodels.contracts.errors import PlanError
        raise PlanError(f"sequence parallel: dimension {dim} of size {size} is not divisible by "
                        f"tp={n}; choose a sequence length divisible by tp or set "
                        "sequence_parallel false")
    return x.chunk(n, dim=dim)[group_rank(group)].contiguous()


def reduce_scatter_along_dim(x, dim, group):
    """This rank's chunk along ``dim`` of ``x`` summed over ``group``, no autograd: the
    reduce-scatter the rewritten rows run (NCCL's own; on gloo an all-reduce and this rank's
    chunk, copies included). Public so that ``autopar profile`` times this very call."""
    n = group_size(group)
    if n == 1:
        return x
    if _fake(group) or x.is_meta:
        return _split(x, dim, group)
    if _nccl(group):
        parts = [p.contiguous() for p in x.chunk(n, dim=dim)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, group=group)
        return out
    return _split(_all_reduce(x.clone(), group), dim, group)


# ---- autograd functions ---------------------------------------------------------------------------

class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g.clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim, grad_mode):
        ctx.group, ctx.dim, ctx.grad_mode = group, dim, grad_mode
        return all_gather_along_dim(x, dim, group)

    @staticmethod
    def backward(ctx, g):
        if ctx.grad_mode == "split":
            return _split(g, ctx.dim, ctx.group), None, None, None
        return reduce_scatter_along_dim(g, ctx.dim, ctx.group), None, None, None


class _ReduceScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return reduce_scatter_along_dim(x, dim, group)

    @staticmethod
    def backward(ctx, g):
        return all_gather_along_dim(g, ctx.dim, ctx.group), None, None


class _ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _split(x, dim, group)

    @staticmethod
    def backward(ctx, g):
        return all_gather_along_dim(g, ctx.dim, ctx.group), None, None


# ---- leaf modules (what the fx graph calls) -------------------------------------------------------

class _Collective(nn.Module):
    """Base: holds the group; deep copies share it (process groups cannot be copied)."""
    fwd = bwd = ""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def __deepcopy__(self, memo):
        new = self.__class__.__new__(self.__class__)
        nn.Module.__init__(new)
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("_modules",)})
        return new

    def extra_repr(self):
        return f"fwd={self.fwd}, bwd={self.bwd}, group={self.group!r}"


class CopyToTP(_Collective):
    fwd, bwd = "identity", "all-reduce"

    def forward(self, x):
        return _CopyToTP.apply(x, self.group)


class ReduceFromTP(_Collective):
    fwd, bwd = "all-reduce", "identity"

    def forward(self, x):
        return _ReduceFromTP.apply(x, self.group)


class GatherSeq(_Collective):
    fwd = "all-gather(seq)"

    def __init__(self, group, grad: str = "reduce_scatter", dim: int = 1):
        super().__init__(group)
        self.grad, self.dim = grad, dim
        self.bwd = "reduce-scatter(seq)" if grad == "reduce_scatter" else "split(seq)"

    def forward(self, x):
        return _GatherSeq.apply(x, self.group, self.dim, self.grad)


class ReduceScatterSeq(_Collective):
    fwd, bwd = "reduce-scatter(seq)", "all-gather(seq)"

    def __init__(self, group, dim: int = 1):
        super().__init__(group)
        self.dim = dim

    def forward(self, x):
        return _ReduceScatterSeq.apply(x, self.group, self.dim)


class ScatterSeq(_Collective):
    fwd, bwd = "split(seq)", "all-gather(seq)"

    def __init__(self, group, dim: int = 1):
        super().__init__(group)
        self.dim = dim

    def forward(self, x):
        return _ScatterSeq.apply(x, self.group, self.dim)


class GatherLastDim(_Collective):
    fwd, bwd = "all-gather(last dim)", "split(last dim)"

    def forward(self, x):
        return _GatherSeq.apply(x, self.group, x.dim() - 1, "split")


COLLECTIVES = (CopyToTP, ReduceFromTP, GatherSeq, ReduceScatterSeq, ScatterSeq, GatherLastDim)
