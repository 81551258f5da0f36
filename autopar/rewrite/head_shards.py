"""Attention code whose tensors are indexed by head but are not the output of a sharded linear:
what the tensor-parallel rewrite does where such a tensor meets the rank's heads.

Three shapes of the same question — a value the serial model computes over *all* heads, used
next to a tensor that holds only this rank's heads (or sequence chunk):

* **a slice of the sharded dim** (Phi-3: ``qkv[..., q:q + kv]`` on a fused q/k/v output with
  grouped-query heads). The column-parallel weight is cut per segment (q, k, v each split over tp),
  so a slice on segment boundaries ``[a, b)`` is ``[a/tp, b/tp)`` of the local tensor
  (:func:`local_slice`); the segments of a fused output come from these slices
  (``pairs._segments_of``). A slice across a segment is refused in one line.
* **a reduction over the sharded dim** (OLMo-2's q/k RMSNorm over heads·head_dim: ``x.pow(2)
  .mean(-1)``): the local reduction, all-reduced over tp (``ReduceFromTP``; a mean then divided by
  tp — the shards are equal), so the statistic is the serial one; its gradient reaches every
  rank's shard through the ``CopyToTP`` the rewrite places where the replicated statistic meets a
  sharded tensor (:meth:`HeadShards._reduce_over_shard`).
* **a replicated tensor of the full size on the sharded dim** (the norm's weight of width
  heads·head_dim, BLOOM's ALiBi bias of shape (batch·heads, 1, keys), DeBERTa's relative-position
  index (batch·heads, q, k), a position table under sequence parallel): sliced to this rank's part
  (:meth:`HeadShards._rank_part`). A parameter or buffer read once is cut where it is stored
  (a parameter's ``ShardSpec`` says so: optimizer state and checkpoints see a shard, the gradient of
  a shard is complete on its rank); anything else is sliced in the graph (:func:`rank_part`),
  a tensor that needs a gradient through ``CopyToTP`` first. A fused (q/k/v) layout is cut per
  segment, as its weight was.

Only elementwise / broadcasting alignments are taken (dims counted from the right, matmul's last
two dims left out): these are exactly the cases that failed before with a shape mismatch, so no
model that ran changes.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from autopar.rewrite.collectives import ReduceFromTP
from autopar.rewrite.fx_util import is_tensor, meta_like, where
from autopar.rewrite.shard_layers import ShardSpec, as_param
from costmodels.contracts.errors import TraceError

_CONTRACTIONS = {torch.bmm, torch.matmul, operator.matmul, torch.mm, F.linear, torch.einsum,
                 "bmm", "matmul", "mm", "__matmul__"}
_REDUCTIONS = {"mean", "sum"}


def rank_part(x: torch.Tensor, dim: int, segments: tuple, rank: int, tp: int, outer: int = 1) -> torch.Tensor:
    """This rank's part of ``x`` along ``dim``: each segment (q, k, v of a fused output; one
    segment for a plain shard) cut in tp blocks, own blocks concatenated. ``outer`` > 1: ``dim``
    holds (outer, n) merged (batch·heads), and the n of each outer index are cut."""
    if outer > 1:
        shape = tuple(x.shape)
        y = x.reshape(*shape[:dim], outer, shape[dim] // outer, *shape[dim + 1:])
        return y.chunk(tp, dim=dim + 1)[rank].reshape(*shape[:dim], -1, *shape[dim + 1:])
    parts = x.split(list(segments), dim=dim) if len(segments) > 1 else (x,)
    return torch.cat([p.chunk(tp, dim=dim)[rank] for p in parts], dim=dim)


def index_dims(items: list, ndim: int) -> list:
    """The input dim each item of an index tuple applies to (None for ``None`` / ``...``)."""
    consumes = [it is not None and it is not Ellipsis for it in items]
    out, d = [], 0
    for i, it in enumerate(items):
        if it is Ellipsis:
            d = ndim - sum(consumes[i + 1:])
            out.append(None)
        elif it is None:
            out.append(None)
        else:
            out.append(d)
            d += 1
    return out


def local_slice(sl: slice, full_size: int, segments: tuple, tp: int, value_of) -> slice | None:
    """``sl`` (a slice of a dim of ``full_size`` split over tp per ``segments``) on the local
    shard, or None when it does not fall on segment boundaries. ``value_of`` resolves a bound
    that is a graph node to its serial int."""
    start, stop, step = (value_of(b) for b in (sl.start, sl.stop, sl.step))
    if step not in (None, 1):
        return None
    start = 0 if start is None else (start + full_size if start < 0 else start)
    stop = full_size if stop is None else (stop + full_size if stop < 0 else min(stop, full_size))
    bounds, acc = {0}, 0
    for s in segments:
        acc += s
        bounds.add(acc)
    if start not in bounds or stop not in bounds or start > stop:
        return None
    local = []
    for b in (start, stop):   # the local offset of a boundary: the segments before it, each ÷ tp
        acc = off = 0
        for s in segments:
            if acc >= b:
                break
            acc, off = acc + s, off + s // tp
        local.append(off)
    return slice(local[0], local[1])


def _is_reduction(n: fx.Node) -> bool:
    return ((n.op == "call_method" and n.target in _REDUCTIONS)
            or (n.op == "call_function" and n.target in (torch.mean, torch.sum)))


class HeadShards:
    """Mixin of the rewrite (``tp._Rewriter``): needs ``LocalGraph``'s state and helpers."""

    # ---- slices of a sharded dim ----------------------------------------------------------------
    def _slice_shard(self, n, a0, sd, idx):
        """``idx`` (an index of sharded ``a0``) with its slice of the sharded dim made local."""
        items = list(idx) if isinstance(idx, tuple) else [idx]
        full = self.full[a0]
        dims = index_dims(items, full.dim())
        if sd not in dims:
            return idx
        it = items[dims.index(sd)]
        if isinstance(it, slice) and not self.strided.get(self.env[a0]):
            segs = self.segmented.get(self.env[a0], (int(full.shape[sd]),))
            new = local_slice(it, int(full.shape[sd]), segs, self.tp,
                              lambda b: self.full[b] if isinstance(b, fx.Node) else b)
            if new is not None:
                items[dims.index(sd)] = new
                return tuple(items) if isinstance(idx, tuple) else items[0]
        raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: '{n.format_node()}' "
                         f"indexes dim {sd} of {tuple(full.shape)}, which tp={self.tp} splits, across its "
                         f"parts {self.segmented.get(self.env[a0], (int(full.shape[sd]),))}{where(n)}: "
                         f"a fused projection whose parts do not each split over {self.tp} ranks (e.g. "
                         "multi-query attention's one k/v head: tp must divide the k/v heads); use tp=1")

    # ---- reductions over a sharded dim ----------------------------------------------------------
    def _reduce_over_shard(self, n, args, kwargs, sharded) -> bool:
        """A mean / sum over the sharded dim: local, all-reduced (a mean ÷ tp). True if done."""
        if not _is_reduction(n) or not sharded or not is_tensor(self.full[n]):
            return False
        x = n.args[0]
        if x not in sharded:
            return False
        sd, nd = self.shard_of(x), self.full[x].dim()
        dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else None)
        dims = range(nd) if dim is None else [d % nd for d in (dim if isinstance(dim, (tuple, list)) else [dim])]
        if sd not in dims:
            return False
        if self.env[x] in self.segmented:
            raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: '{n.format_node()}' "
                             f"reduces a fused output split per part{where(n)}; use tp=1")
        node = self._add(n.op, n.target, args, kwargs, src=n, name=n.name + "_local")
        node = self._collective(ReduceFromTP, node, f"{n.name}_all_reduce")
        if n.target in ("mean", torch.mean):
            node = self._add("call_function", operator.truediv, (node, self.tp), src=n, name=n.name)
        self.env[n] = node
        self.needs_grad[node] = self.full[n].is_floating_point()
        self._check(n)
        return True

    # ---- replicated tensors of the full size on a sharded dim -----------------------------------
    def _align_replicated(self, n, args, kwargs, ins, sharded):
        """(args, kwargs) with every replicated tensor input that has the full size on the dim the
        sharded inputs are split on cut to this rank's part."""
        if not sharded or not is_tensor(self.full.get(n)):
            return args, kwargs
        from_right = {self.full[s].dim() - self.shard_of(s) for s in sharded}
        if len(from_right) != 1:
            return args, kwargs
        r = from_right.pop()
        if n.target in _CONTRACTIONS and r <= 2:
            return args, kwargs
        size = int(self.full[sharded[0]].shape[-r])
        segs = next((self.segmented[self.env[s]] for s in sharded if self.env[s] in self.segmented), (size,))
        outer = max(self.strided.get(self.env[s], 1) for s in sharded)
        cut = {}
        for a in ins:
            if a in sharded or a in cut or self.full[a].dim() < r or int(self.full[a].shape[-r]) != size:
                continue
            if size == 1 or tuple(self.full[a].shape) != tuple(self.local[self.env[a]].shape):
                continue
            cut[a] = self._rank_part(a, self.full[a].dim() - r, segs, outer)
        if not cut:
            return args, kwargs
        swap = {self.env[a]: new for a, new in cut.items()}
        args = list(fx.node.map_arg(tuple(args), lambda x: swap.get(x, x)))
        kwargs = dict(fx.node.map_arg(kwargs, lambda x: swap.get(x, x)))
        return args, kwargs

    def _rank_part(self, a, dim, segs, outer=1):
        """This rank's part of replicated serial node ``a`` along ``dim`` (a new local node)."""
        new = self.env[a]
        if outer > 1 and len(segs) > 1:
            raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: '{a.format_node()}' "
                             f"meets a fused output whose heads are merged with the batch{where(a)}; use tp=1")
        if a.op == "get_attr" and len(a.users) == 1 and a.target in self.root and outer == 1:
            t = self.root[a.target]
            part = rank_part(t.detach(), dim, segs, self.rank, self.tp).clone()
            self.root[a.target] = as_param(part, t) if isinstance(t, torch.nn.Parameter) else part
            self.specs[a.target] = ShardSpec(self.specs[a.target].name, dim, segs if len(segs) > 1 else None)
            self.local[new] = meta_like(self.root[a.target])
            self.needs_grad[new] = False   # the shard's gradient is whole on its rank
            return new
        src = self._grad_all_reduced(new)
        node = self._add("call_function", rank_part, (src, dim, tuple(segs), self.rank, self.tp, outer),
                         name=f"{a.name}_rank_part")
        self.needs_grad[node] = False
        return node

    def _carry_segments(self, n, node, sharded):
        """An elementwise result of a per-part (fused) tensor keeps its per-part layout."""
        for s in sharded:
            segs = self.segmented.get(self.env[s])
            if segs and tuple(self.full[s].shape) == tuple(getattr(self.full[n], "shape", ())) \
                    and self.shard_of(s) == self._shard(self.full[n], self.local[node], n):
                self.segmented[node] = segs
                return

    # ---- heads merged with the batch: (batch·heads, ...) ------------------------------------------
    def _view_split(self, n, in_shape, sd, out_shape):
        """(output dim holding input dim ``sd`` — the split one — after view ``n``, its outer
        factor). BLOOM and DeBERTa merge the batch into the heads (``reshape(B * H, S, D)``): the
        local dim is then (B, H/tp) merged, recorded as outer B (``strided``) so that a tensor of
        the full (B·H) size is cut per batch row and the later ``view(B, H, ...)`` splits H."""
        if (j := self._flat_tokens_view_dim(in_shape, sd, out_shape)) is not None:   # flat_tokens
            return j, 1
        outer = self.strided.get(self.env[n.args[0]], 1)
        prefix = math.prod(in_shape[:sd])
        if outer > 1:   # (outer·heads, ...) unmerged again: the heads dim follows the outer one
            for j in range(len(out_shape)):
                if math.prod(out_shape[:j]) == prefix * outer and out_shape[j] != 1:
                    return j, 1
        for j in range(len(out_shape)):
            if math.prod(out_shape[:j]) == prefix and out_shape[j] != 1:
                return j, outer
        for j in reversed(range(len(out_shape))):   # outer dims merged into the split one
            before = math.prod(out_shape[:j])
            if prefix % before == 0 and out_shape[j] % ((prefix // before) * in_shape[sd]) == 0:
                return j, outer * (prefix // before)
        raise TraceError(f"tensor-parallel rewrite: '{n.format_node()}' merges the split dim {sd} of "
                         f"{tuple(in_shape)} into {tuple(out_shape)} in a way autopar cannot follow; keep "
                         f"the head dim separate{where(n)}")

    def _carry_outer(self, n, node, sharded):
        """Record whether ``node``'s split dim is (outer, heads) merged (see ``_view_split``)."""
        d = self._shard(self.full[n], self.local[node], n) if sharded else None
        if d is None:
            return
        x = n.args[0] if n.args else None
        name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "")
        if name in ("view", "reshape") and x in sharded and x not in self.layout.segments:
            _, outer = self._view_split(n, self.full[x].shape, self.shard_of(x), tuple(self.full[n].shape))
        else:
            outer = max(self.strided.get(self.env[s], 1) for s in sharded)
            if name == "repeat" and x in sharded:   # (heads, ...).repeat(B, 1, 1): tiled per batch row
                reps = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (tuple, list)) else n.args[1:]
                reps = [self.full[r] if isinstance(r, fx.Node) else r for r in reps]
                k = len(reps) - self.full[n].dim() + d
                outer *= int(reps[k]) if 0 <= k < len(reps) else 1
        if outer > 1:
            self.strided[node] = outer

    def _refuse_strided(self, n, nodes, what):
        """What only a plain split runs (dropout's serial mask, a row-parallel linear's input)."""
        if any(self.strided.get(self.env[x]) for x in nodes if isinstance(x, fx.Node) and x in self.env):
            raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: {what} runs on a "
                             f"dim that merges the batch with the heads{where(n)}; use micro_batch_size=1 "
                             "or tp=1")
