"""Rewriting the size arguments of shape-consuming ops for the local shard.

nanoGPT-style code passes sizes read from tensors (``B, T, C = x.size()``) or literals to
``view`` / ``reshape`` / ``expand`` / ``split`` / slicing. On a shard those must be the local
sizes: the expected local output shape is the serial one with the sharded dim divided by tp, and
each size argument is fixed to it — a literal is replaced; a symbolic int read from a tensor is
divided or multiplied by tp in the graph (``C // 2``), so the emitted code still reads like the
user's. Ops that merely consume sizes (``arange``, ``new_zeros``, slice bounds) keep the serial
values.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from autopar.rewrite.fx_util import is_tensor, where
from autopar.rewrite.local_graph import LocalGraph
from autopar.rewrite.pairs import fused_view_parts
from costmodels.contracts.errors import PlanError, TraceError


def _sizes_arg(args):
    """(sizes, packed): ``x.view((a, b))`` passes them packed, ``x.view(a, b)`` unpacked."""
    if len(args) == 2 and isinstance(args[1], (tuple, list)):
        return args[1], True
    return args[1:], False


def _has_node(idx) -> bool:
    found = []
    fx.node.map_arg(idx, lambda a: found.append(a))
    return bool(found)


class SizeFixer(LocalGraph):
    def _fix_sizes(self, n, args, kwargs):
        """Rewrite size arguments of shape-consuming ops to the local shard's values."""
        op, tgt = n.op, n.target
        a0 = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        if a0 is None or not is_tensor(self.full.get(a0)):
            return args, kwargs
        full_in = self.full[a0]
        sd = self.shard_of(a0)
        name = tgt if op == "call_method" else getattr(tgt, "__name__", "")
        if name in ("view", "reshape") and (op == "call_method" or tgt is torch.reshape):
            sizes, packed = _sizes_arg(args)
            out_full = tuple(self.full[n].shape)
            expected = list(out_full)
            segments = self.layout.segments
            if sd is not None and a0 in segments and len(segments[a0]) > 1 and fused_view_parts(n, self.full):
                j = full_in.dim()   # (..., k, H, D): the heads of each fused part are split
                if out_full[j] % self.tp:
                    raise PlanError(f"plan field 'tp'={self.tp} does not divide heads={out_full[j]}{where(n)}")
                expected[j] //= self.tp
            elif sd is not None:
                j = self._view_dim(full_in.shape, sd, out_full, n)
                if out_full[j] % self.tp:
                    raise PlanError(f"plan field 'tp'={self.tp} does not divide the size {out_full[j]} "
                                    f"that {n.name} splits{where(n)}")
                expected[j] //= self.tp
            sizes = self._fix_list(sizes, expected, n)
            args = [args[0], tuple(sizes)] if packed else [args[0], *sizes]
        elif name == "expand" and op == "call_method":
            sizes, packed = _sizes_arg(args)
            out_full = tuple(self.full[n].shape)
            expected = list(out_full)
            if sd is not None:
                expected[sd + len(out_full) - full_in.dim()] //= self.tp
            sizes = self._fix_list(sizes, expected, n)
            args = [args[0], tuple(sizes)] if packed else [args[0], *sizes]
        elif name == "split":
            dim = n.kwargs.get("dim", n.args[2] if len(n.args) > 2 else 0) % full_in.dim()
            full_sizes = [int(t.shape[dim]) for t in self.full[n]]
            if dim == sd:
                expected = [s // self.tp for s in full_sizes]
            else:
                expected = full_sizes
            spec = args[1]
            if isinstance(spec, (list, tuple)):
                args[1] = type(spec)(self._fix_list(list(spec), expected, n))
            else:
                args[1] = self._fix_list([spec], [expected[0]], n)[0]
        elif op == "call_function" and tgt is operator.getitem and isinstance(n.args[1], (tuple, slice, fx.Node, int)):
            if _has_node(n.args[1]):
                args[1] = self._fix_index(n, args[1])
        else:
            # any other op taking symbolic ints (arange, new_zeros, ...): they must keep serial values
            args = [self._keep_serial(a, o, n, bools=False) for a, o in zip(args, n.args)]
        return args, kwargs

    def _keep_serial(self, new, orig, n, bools=True):
        """``new`` (the local copy of argument ``orig``), fixed to ``orig``'s serial value when
        ``orig`` is a symbolic int (or bool, unless ``bools`` is false)."""
        v = self.full.get(orig) if isinstance(orig, fx.Node) else None
        if isinstance(v, int) and (bools or not isinstance(v, bool)):
            return self._fix_list([new], [v], n)[0]
        return new

    def _fix_index(self, n, idx):
        """Slice bounds that are symbolic ints keep their serial values (a sliced sharded dim is
        not supported)."""
        items = list(idx) if isinstance(idx, tuple) else [idx]
        orig = list(n.args[1]) if isinstance(n.args[1], tuple) else [n.args[1]]
        out = []
        for new_it, old_it in zip(items, orig):
            if isinstance(old_it, slice):
                parts = [self._keep_serial(nb, ob, n) for nb, ob in
                         ((new_it.start, old_it.start), (new_it.stop, old_it.stop), (new_it.step, old_it.step))]
                out.append(slice(*parts))
            else:
                out.append(self._keep_serial(new_it, old_it, n))
        return tuple(out) if isinstance(idx, tuple) else out[0]

    def _view_dim(self, in_shape, sd, out_shape, n):
        """The output dim of a view that holds the input's sharded dim ``sd``."""
        if (j := self._flat_tokens_view_dim(in_shape, sd, out_shape)) is not None:   # flat_tokens
            return j
        prefix = math.prod(in_shape[:sd])
        for j in range(len(out_shape)):
            if math.prod(out_shape[:j]) == prefix and out_shape[j] != 1:
                return j
        raise TraceError(f"tensor-parallel rewrite: '{n.format_node()}' merges the split dim {sd} of "
                         f"{tuple(in_shape)} with an outer dim ({tuple(out_shape)}); keep the head "
                         f"dim separate{where(n)}")

    def _fix_list(self, sizes, expected, n):
        out = []
        for s, e in zip(sizes, expected):
            if isinstance(s, fx.Node):
                v = self.local[s]
                if isinstance(v, int) and v != e:
                    if v == e * self.tp:
                        s = self._add("call_function", operator.floordiv, (s, self.tp), name=f"{s.name}_local")
                    elif v * self.tp == e:
                        s = self._add("call_function", operator.mul, (s, self.tp), name=f"{s.name}_full")
                    else:
                        s = e
            elif isinstance(s, int) and s != -1 and s != e:
                s = e
            out.append(s)
        return out
