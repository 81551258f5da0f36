"""Tensor- and sequence-parallel rewrite of one row, as torch.fx passes.

How it works (``rewrite_row`` → ``_Rewriter.run``):

1. **Trace** the row with ``torch.fx`` (buffers proxied, ``math`` auto-wrapped), so nanoGPT-style
   code — ``B, T, C = x.size()``, ``x.view(B, T, self.n_head, C // self.n_head)``,
   ``qkv.split(C, dim=2)`` — becomes a graph whose sizes are symbolic ints or literals.
2. **Propagate full shapes** (the serial row, on ``meta`` tensors) to know every node's value.
3. **Find Megatron pairs** (blocks): a row-parallel linear R and the column-parallel linears
   reached backwards from R's input through tensor ops only (no residual, no other linear). The
   fused-qkv layout (``split``/``chunk`` of a column output along its last dim) gives the segment
   sizes the weight is split by (per q/k/v, then per head group).
4. **Rebuild the graph on the local shard, node by node, executing it on meta tensors** as it
   goes. Each node's local shape is compared with its full shape: at most one dim may differ, by
   a factor tp (that is the node's sharded dim). Shape-consuming ops (``view``/``reshape``/
   ``expand``/``split``/slicing) get their size arguments rewritten to the expected local values:
   a literal is replaced, a symbolic int is divided or multiplied by tp (``C // 2``). Collectives
   are inserted as explicit leaf modules (``autopar.rewrite.collectives``): ``CopyToTP`` /
   ``GatherSeq`` before column linears, ``ReduceFromTP`` / ``ReduceScatterSeq`` after row linears,
   vocab-parallel embedding + ``ReduceFromTP``, vocab-parallel head + ``GatherLastDim``,
   ``ScatterSeq`` / ``GatherSeq`` at the embedding's output / head's input under sequence
   parallel. A replicated tensor that needs a gradient (a parameter, e.g. a LayerNorm weight on
   sequence shards, or a row-parallel bias) meeting a sharded one goes through ``CopyToTP`` so its
   gradient is all-reduced over tp inside autograd.
5. Recompute (``autopar.rewrite.recompute``) is applied to the result.
"""
from __future__ import annotations

import copy
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.rewrite.collectives import (CopyToTP, FakeGroup, GatherLastDim, GatherSeq, ReduceFromTP,
                                         ReduceScatterSeq, ScatterSeq, group_rank, group_size)
from costmodels.errors import PlanError, TraceError

KINDS = ("embedding", "block", "head")
RECOMPUTE = ("none", "selective", "full")
SEQ_DIM = 1


@dataclass(frozen=True)
class ShardSpec:
    """How a local tensor relates to the original row's: ``name`` there, the sharded ``dim``
    (None = replicated) and, for a fused tensor (qkv), the full ``segments`` sizes along ``dim``
    (each segment is split in tp contiguous blocks; the local tensor concatenates own blocks)."""
    name: str
    dim: int | None = None
    segments: tuple[int, ...] | None = None


# ---- sharded linear / embedding modules ------------------------------------------------------------

class ColumnParallelLinear(nn.Linear):
    """This rank's output features of a column-parallel linear (input replicated)."""


class RowParallelLinear(nn.Linear):
    """This rank's input features of a row-parallel linear. ``forward`` leaves the bias out: the
    graph adds it once, after the tensor-parallel reduction."""

    def forward(self, x):
        return F.linear(x, self.weight)


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``[vocab_start, vocab_end)`` of the embedding table; ids outside give zeros (the
    graph all-reduces the result over tp)."""

    def __init__(self, num_embeddings, embedding_dim, vocab_start, vocab_end, **kw):
        super().__init__(num_embeddings, embedding_dim, **kw)
        self.vocab_start, self.vocab_end = vocab_start, vocab_end

    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight)
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


# ---- helpers --------------------------------------------------------------------------------------

def drop_stale_fx_wraps() -> None:
    """torch.fx keeps a global table of ``torch.fx.wrap``-ed names per module globals. Code that
    fx generated for a graph holding a qualified wrapped call (e.g. ``_assert_is_none`` from
    ``concrete_args``) registers a dotted name its globals do not hold, and every later
    ``symbolic_trace`` in the process then fails with a KeyError. Drop such entries."""
    try:
        import builtins
        from torch.fx import _symbolic_trace as st
        table = st._wrapped_fns_to_patch
        for key, frame in list(table.items()):
            if key[1] not in frame and not hasattr(builtins, key[1]):
                del table[key]
    except Exception:  # noqa: BLE001 - private torch state; tracing reports its own errors
        pass


def trace_row(module: nn.Module) -> fx.GraphModule:
    drop_stale_fx_wraps()
    tracer = fx.Tracer()
    tracer.proxy_buffer_attributes = True
    tracer.record_stack_traces = True
    try:
        graph = tracer.trace(module)
    except Exception as e:  # noqa: BLE001 - report the user's line
        raise TraceError(f"cannot trace {type(module).__name__} with torch.fx for the rewrite: "
                         f"{type(e).__name__}: {e}") from None
    return fx.GraphModule(module, graph)


def _meta(t):
    if isinstance(t, torch.Tensor):
        return torch.empty_like(t, device="meta")
    return t


def _meta_call(mod: nn.Module, args, kwargs):
    if all(p.is_meta for p in mod.parameters()) and all(b.is_meta for b in mod.buffers()):
        return mod(*args, **kwargs)
    state = {n: _meta(t) for n, t in list(mod.named_parameters()) + list(mod.named_buffers())}
    return torch.func.functional_call(mod, state, args, kwargs)


def _where(node: fx.Node) -> str:
    st = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in st.strip().splitlines() if ln.strip()]
    if len(lines) >= 2:
        return f" at {lines[-2]}: {lines[-1]}"
    return f" (node {node.name})"


def _is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def _tensor_like(v) -> bool:
    return _is_tensor(v) or (isinstance(v, (tuple, list)) and v and all(_is_tensor(x) for x in v))


def _is_size_node(n: fx.Node) -> bool:
    return ((n.op == "call_method" and n.target in ("size", "dim")) or
            (n.op == "call_function" and n.target is getattr and len(n.args) > 1
             and n.args[1] in ("shape", "ndim")))


def _divisors(n: int) -> str:
    return "{" + ", ".join(str(d) for d in range(1, n + 1) if n % d == 0) + "}"


def _shard_rows(t: torch.Tensor, segments, rank, tp) -> torch.Tensor:
    parts = t.split(list(segments), dim=0)
    return torch.cat([p.chunk(tp, dim=0)[rank] for p in parts], dim=0).detach().clone()


def _param(t: torch.Tensor, like: torch.Tensor | None = None) -> nn.Parameter:
    src = t if like is None else like
    return nn.Parameter(t.detach().clone(), requires_grad=src.requires_grad)


def infer_example_input(module: nn.Module, kind: str, tp: int):
    """A small serial input for gpt/llama-style rows: ids (2, 2·tp) or activations (2, 2·tp, h)."""
    T = 2 * max(tp, 1)
    first = next((m for m in module.modules() if not list(m.children()) and list(m.parameters(recurse=False))), None)
    if kind == "embedding":
        if isinstance(first, nn.Embedding):
            return torch.zeros(2, T, dtype=torch.long, device="meta")
        raise TraceError(f"rewrite_row(kind='embedding') cannot guess the input of "
                         f"{type(module).__name__}; pass example_input (the row's serial input)")
    hidden = None
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            hidden = m.normalized_shape[-1]
        elif isinstance(m, nn.Linear):
            hidden = m.in_features
        elif not list(m.children()):
            ps = list(m.parameters(recurse=False))
            if len(ps) == 1 and ps[0].dim() == 1:
                hidden = ps[0].numel()
        if hidden:
            break
    if not hidden:
        raise TraceError(f"rewrite_row cannot guess the input size of {type(module).__name__}; pass "
                         "example_input (the row's serial input)")
    p = next(module.parameters(), None)
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    return torch.zeros(2, T, hidden, dtype=dtype, device="meta")


# ---- the rewriter ----------------------------------------------------------------------------------

class _Rewriter:
    def __init__(self, module, kind, tp_rank, tp_size, group, sp, example):
        self.module, self.kind, self.rank, self.tp, self.group, self.sp = (
            module, kind, tp_rank, tp_size, group, sp)
        self.traced = trace_row(module)
        self.old = self.traced.graph
        self.example = example if isinstance(example, tuple) else (example,)
        self.g = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}
        self.local: dict[fx.Node, Any] = {}
        self.root: dict[str, Any] = {}
        self.specs: dict[str, ShardSpec] = {}
        self.persist_off: set[str] = set()
        self.needs_grad: dict[fx.Node, bool] = {}   # new node -> replicated and requires grad
        self.entries: dict[fx.Node, fx.Node] = {}
        self.names: set[str] = set()
        self.coll_log: list[dict] = []

    # -- analysis on the full (serial) graph ---------------------------------------------------------
    def propagate_full(self):
        self.full: dict[fx.Node, Any] = {}
        phs = [n for n in self.old.nodes if n.op == "placeholder"]
        with torch.no_grad():
            for n in self.old.nodes:
                if n.op == "placeholder":
                    i = phs.index(n)
                    self.full[n] = (_meta(self.example[i]) if i < len(self.example)
                                    else (n.args[0] if n.args else None))
                elif n.op == "output":
                    self.full[n] = fx.node.map_arg(n.args[0], lambda a: self.full[a])
                else:
                    self.full[n] = self._exec(n, self.full, self.traced)

    def _exec(self, n, vals, owner):
        args = fx.node.map_arg(n.args, lambda a: vals[a])
        kwargs = fx.node.map_arg(n.kwargs, lambda a: vals[a])
        try:
            if n.op == "get_attr":
                return _meta(_getattr_path(owner, n.target))
            if n.op == "call_function":
                return n.target(*args, **kwargs)
            if n.op == "call_method":
                return getattr(args[0], n.target)(*args[1:], **kwargs)
            if n.op == "call_module":
                mod = owner.get_submodule(n.target) if isinstance(owner, nn.Module) else owner[n.target]
                if hasattr(mod, "group"):
                    return mod(*args, **kwargs)
                return _meta_call(mod, args, kwargs)
        except (PlanError, TraceError):
            raise
        except Exception as e:  # noqa: BLE001
            raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: op "
                             f"'{n.format_node()}' fails on the local shard{_where(n)}: "
                             f"{type(e).__name__}: {e}") from None
        raise AssertionError(n.op)

    def _mod(self, n):
        return self.traced.get_submodule(n.target) if n.op == "call_module" else None

    def _is_linear(self, n):
        return n.op == "call_module" and isinstance(self._mod(n), nn.Linear)

    def find_pairs(self):
        """Megatron pairs: {row node: [column nodes]} (blocks only)."""
        self.cols: dict[fx.Node, fx.Node] = {}     # column node -> row node
        self.rows: dict[fx.Node, list] = {}
        self.segments: dict[fx.Node, tuple] = {}
        self.pair_kind: dict[fx.Node, str] = {}
        if self.kind != "block" or self.tp == 1:
            return
        used = set()
        for r in self.old.nodes:
            if not self._is_linear(r) or r in used:
                continue
            cols, ok, region = [], True, set()
            stack, seen = [r.args[0]], set()
            while stack:
                a = stack.pop()
                if a in seen:
                    continue
                seen.add(a)
                if not _tensor_like(self.full.get(a)) or _is_size_node(a):
                    continue
                if self._is_linear(a):
                    cols.append(a)
                    continue
                if a.op == "placeholder":
                    ok = False
                    break
                if a.op == "get_attr":
                    continue
                region.add(a)
                stack.extend(a.all_input_nodes)
            if not ok or not cols or any(c in used for c in cols):
                continue
            # column outputs must flow only into this pair's region
            if not self._contained(cols, r, region):
                continue
            cols.sort(key=lambda c: list(self.old.nodes).index(c))
            used.update(cols)
            used.add(r)
            self.rows[r] = cols
            for c in cols:
                self.cols[c] = r
                self.segments[c] = self._segments_of(c)
            attention = any(self._is_attention_op(a) for a in region)
            self.pair_kind[r] = "attention" if attention else "mlp"
            self._check_divisible(r, cols, region, attention)

    def _contained(self, cols, r, region):
        for c in cols:
            stack, seen = [c], set()
            while stack:
                a = stack.pop()
                if a in seen:
                    continue
                seen.add(a)
                for u in a.users:
                    if u is r or _is_size_node(u):
                        continue
                    if u.op == "output" or (u not in region and _tensor_like(self.full.get(u))):
                        return False
                    stack.append(u)
        return True

    @staticmethod
    def _is_attention_op(n):
        if n.op == "call_function" and n.target in (F.softmax, torch.softmax, F.scaled_dot_product_attention):
            return True
        return n.op == "call_method" and n.target == "softmax"

    def _segments_of(self, c):
        out = self.full[c].shape[-1]
        for u in c.users:
            tgt = u.target
            if (u.op == "call_method" and tgt in ("split", "chunk")) or (
                    u.op == "call_function" and tgt in (torch.split, torch.chunk)):
                dim = u.kwargs.get("dim", u.args[2] if len(u.args) > 2 else 0)
                if dim % self.full[c].dim() == self.full[c].dim() - 1:
                    sizes = tuple(int(t.shape[-1]) for t in self.full[u])
                    if sum(sizes) == out:
                        return sizes
            k = self._fused_view_parts(u)
            if k:
                return (out // k,) * k
        return (out,)

    def _fused_view_parts(self, u):
        """k when ``u`` reshapes a fused column output (..., k·H·D) into (..., k, H, D), k in 2, 3
        (timm / many user codes: ``qkv.reshape(B, N, 3, H, D)``); else 0."""
        if not (u.op == "call_method" and u.target in ("view", "reshape")) and not (
                u.op == "call_function" and u.target is torch.reshape):
            return 0
        a = u.args[0]
        if not isinstance(a, fx.Node) or not _is_tensor(self.full.get(a)) or not _is_tensor(self.full.get(u)):
            return 0
        src, out = tuple(self.full[a].shape), tuple(self.full[u].shape)
        if len(out) == len(src) + 2 and out[:len(src) - 1] == src[:-1] and out[len(src) - 1] in (2, 3):
            return out[len(src) - 1]
        return 0

    def _check_divisible(self, r, cols, region, attention):
        tp, where = self.tp, type(self.module).__name__
        if not attention:
            for c in cols:
                for s in self.segments[c]:
                    if s % tp:
                        raise PlanError(f"plan field 'tp'={tp} does not divide ffn={s} (the MLP's "
                                        f"hidden size, {c.target} in {where}); choose tp in {_divisors(s)}")
            return
        heads = []
        for a in region:
            if a.op == "call_method" and a.target in ("view", "reshape") or (
                    a.op == "call_function" and a.target is torch.reshape):
                src, out = self.full[a.args[0]].shape, self.full[a].shape
                if len(out) == len(src) + 1 and tuple(out[:len(src) - 1]) == tuple(src[:-1]):
                    heads.append(int(out[len(src) - 1]))
                elif self._fused_view_parts(a):
                    heads.append(int(out[len(src)]))
        if not heads:
            return
        hq, hkv = max(heads), min(heads)
        if hq % tp:
            raise PlanError(f"plan field 'tp'={tp} does not divide heads={hq} ({where}); "
                            f"choose tp in {_divisors(hq)}")
        if hkv % tp:
            raise PlanError(f"plan field 'tp'={tp} does not divide kv_heads={hkv} ({where}); "
                            f"choose tp in {_divisors(hkv)}")

    # -- building the local graph ----------------------------------------------------------------
    def _name(self, base: str) -> str:
        name, i = base, 1
        while name in self.names or name in self.root:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def _add(self, op, target, args, kwargs=None, src: fx.Node | None = None, name=None):
        node = self.g.create_node(op, target, tuple(args), dict(kwargs or {}), name=name)
        if src is not None:
            node.meta = dict(src.meta)
        owner = self.root
        self.local[node] = self._exec_new(node, owner, src)
        return node

    def _exec_new(self, node, owner, src):
        args = fx.node.map_arg(node.args, lambda a: self.local[a])
        kwargs = fx.node.map_arg(node.kwargs, lambda a: self.local[a])
        try:
            with torch.no_grad():
                if node.op == "get_attr":
                    return _meta(self._root_get(node.target))
                if node.op == "call_function":
                    return node.target(*args, **kwargs)
                if node.op == "call_method":
                    return getattr(args[0], node.target)(*args[1:], **kwargs)
                if node.op == "call_module":
                    mod = owner[node.target]
                    if hasattr(mod, "group"):
                        return mod(*args, **kwargs)
                    return _meta_call(mod, args, kwargs)
                if node.op == "placeholder":
                    return None
        except (PlanError, TraceError):
            raise
        except Exception as e:  # noqa: BLE001
            at = _where(src) if src is not None else ""
            raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: "
                             f"'{(src or node).format_node()}' fails on the local shard{at}: "
                             f"{type(e).__name__}: {e}") from None
        raise AssertionError(node.op)

    def _root_get(self, path):
        if path in self.root:
            return self.root[path]
        owner, _, leaf = path.rpartition(".")
        return getattr(self._root_get(owner), leaf)

    def _collective(self, cls, x, base, *cargs, **ckw):
        name = self._name(base)
        self.root[name] = cls(self.group, *cargs, **ckw)
        node = self._add("call_module", name, (x,), name=name.replace(".", "_"))
        a, b = self.local.get(x), self.local.get(node)
        if _is_tensor(a) and _is_tensor(b):
            self.coll_log.append({"name": name, "module": cls.__name__, "in_shape": tuple(a.shape),
                                  "out_shape": tuple(b.shape),
                                  "bytes": max(a.numel(), b.numel()) * a.element_size()})
        return node

    def _module(self, name, mod, spec_for=None):
        """Register a leaf module under its original qualified name (params cloned)."""
        self.root[name] = mod
        self.names.add(name)
        for pname, _ in list(mod.named_parameters()) + list(mod.named_buffers()):
            full = f"{name}.{pname}"
            self.specs.setdefault(full, (spec_for or {}).get(pname, ShardSpec(full)))
        for b in getattr(mod, "_non_persistent_buffers_set", ()):
            self.persist_off.add(f"{name}.{b}")

    def shard_of(self, old: fx.Node):
        """Sharded dim of old node's local value (None: same shape as serial)."""
        return self._shard(self.full[old], self.local[self.env[old]], old)

    def _shard(self, full, local, where: fx.Node | None = None):
        if not (_is_tensor(full) and _is_tensor(local)):
            return None
        if tuple(full.shape) == tuple(local.shape):
            return None
        diff = [d for d in range(full.dim()) if full.dim() == local.dim() and full.shape[d] != local.shape[d]]
        if len(diff) == 1 and local.shape[diff[0]] * self.tp == full.shape[diff[0]]:
            return diff[0]
        w = _where(where) if where is not None else ""
        raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: local shape "
                         f"{tuple(local.shape)} does not match serial shape {tuple(full.shape)} split "
                         f"by tp={self.tp}{w}")

    def run(self) -> fx.GraphModule:
        self.propagate_full()
        self.find_pairs()
        self.find_vocab()
        col_inputs = {c.args[0] for c in self.cols}
        phs = [n for n in self.old.nodes if n.op == "placeholder"]
        for n in self.old.nodes:
            if n.op == "placeholder":
                self._placeholder(n, phs.index(n))
            elif n.op == "output":
                self._output(n)
            elif n in self.cols:
                self._column(n)
            elif n in self.rows:
                self._row(n)
            elif n is self.vocab_embedding:
                self._vocab_embedding(n)
            elif n is self.vocab_head:
                self._vocab_head(n)
            else:
                self._generic(n)
            if n in col_inputs:
                self._entry(n)
        self.g.lint()
        gm = fx.GraphModule(self.root, self.g, class_name=type(self.module).__name__ + "Shard")
        for name in self.persist_off:
            owner, _, leaf = name.rpartition(".")
            mod = gm.get_submodule(owner) if owner else gm
            if leaf in mod._buffers:
                mod._non_persistent_buffers_set.add(leaf)
        gm.autopar_shards = {k: v for k, v in self.specs.items() if _has_tensor(gm, k)}
        return gm

    def find_vocab(self):
        self.vocab_embedding = self.vocab_head = None
        if self.tp == 1:
            return
        if self.kind == "embedding":
            for n in self.old.nodes:
                if (n.op == "call_module" and isinstance(self._mod(n), nn.Embedding)
                        and n.args and isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder"):
                    if self._mod(n).num_embeddings % self.tp == 0:
                        self.vocab_embedding = n
                    break
        elif self.kind == "head":
            out = next(n for n in self.old.nodes if n.op == "output")
            lin = [n for n in self.old.nodes if self._is_linear(n) and _reaches(n, out)]
            if lin and self._mod(lin[-1]).out_features % self.tp == 0:
                self.vocab_head = lin[-1]

    def _placeholder(self, n, i):
        node = self.g.placeholder(n.target, default_value=n.args[0] if n.args else
                                  __import__("inspect").Signature.empty)
        node.meta = dict(n.meta)
        val = self.full[n]
        self.needs_grad[node] = _is_tensor(val) and val.is_floating_point() and not (
            i == 0 and self.sp and self.kind == "block")
        if i == 0 and self.sp and self.kind in ("block", "head") and _is_tensor(val):
            if val.dim() < 2 or val.shape[SEQ_DIM] % self.tp:
                raise PlanError(f"plan field 'sequence_parallel' needs the sequence length "
                                f"({val.shape[SEQ_DIM] if val.dim() > 1 else 'none'}) divisible by "
                                f"tp={self.tp}; set sequence_parallel false or change tp")
            self.local[node] = val.chunk(self.tp, dim=SEQ_DIM)[self.rank]
            if self.kind == "head":   # gather the sequence before anything of the head runs
                node = self._collective(GatherSeq, node, "sp_gather_input", grad="split")
                self.needs_grad[node] = True
        else:
            self.local[node] = val
        self.env[n] = node

    def _output(self, n):
        out = self.env[n.args[0]] if isinstance(n.args[0], fx.Node) else None
        if out is None:
            self.g.output(fx.node.map_arg(n.args[0], lambda a: self.env[a]))
            return
        if self.sp and self.kind == "embedding" and self.tp > 1:
            full = self.full[n.args[0]]
            if full.dim() < 2 or full.shape[SEQ_DIM] % self.tp:
                raise PlanError(f"plan field 'sequence_parallel' needs the sequence length "
                                f"({full.shape[SEQ_DIM] if full.dim() > 1 else 'none'}) divisible by "
                                f"tp={self.tp}; set sequence_parallel false or change tp")
            out = self._collective(ScatterSeq, out, "sp_scatter_output")
        want = SEQ_DIM if (self.sp and self.kind in ("embedding", "block") and self.tp > 1) else None
        got = self._shard(self.full[n.args[0]], self.local[out], n)
        if got != want:
            raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: the row's output "
                             f"ends up {'replicated' if got is None else f'split on dim {got}'} instead "
                             f"of {'replicated' if want is None else f'split on dim {want}'}")
        self.g.output(out)

    def _entry(self, u):
        """Where the replicated input of column-parallel linears enters the tp region."""
        x = self.env[u]
        base = (next(c for c in self.cols if c.args[0] is u).target.rpartition(".")[0] or "tp")
        if self.sp:
            node = self._collective(GatherSeq, x, f"{base}.sp_gather", grad="reduce_scatter")
        else:
            node = self._collective(CopyToTP, x, f"{base}.copy_to_tp")
        self.entries[u] = node

    def _column(self, n):
        mod: nn.Linear = self._mod(n)
        segs = self.segments[n]
        lin = ColumnParallelLinear(mod.in_features, mod.out_features // self.tp, bias=mod.bias is not None,
                                   device="meta", dtype=mod.weight.dtype)
        lin.weight = _param(_shard_rows(mod.weight, segs, self.rank, self.tp), mod.weight)
        if mod.bias is not None:
            lin.bias = _param(_shard_rows(mod.bias, segs, self.rank, self.tp), mod.bias)
        seg = segs if len(segs) > 1 else None
        self._module(n.target, lin, {"weight": ShardSpec(f"{n.target}.weight", 0, seg),
                                     "bias": ShardSpec(f"{n.target}.bias", 0, seg)})
        node = self._add("call_module", n.target, (self.entries[n.args[0]],), src=n, name=n.name)
        self.env[n] = node
        self._check(n)

    def _row(self, n):
        mod: nn.Linear = self._mod(n)
        x = self.env[n.args[0]]
        if self.shard_of(n.args[0]) != self.full[n.args[0]].dim() - 1:
            raise TraceError(f"tensor-parallel rewrite: the input of row-parallel {n.target} is not "
                             f"split on its last dim{_where(n)}")
        lin = RowParallelLinear(mod.in_features // self.tp, mod.out_features, bias=mod.bias is not None,
                                device="meta", dtype=mod.weight.dtype)
        lin.weight = _param(mod.weight.chunk(self.tp, dim=1)[self.rank])
        if mod.bias is not None:
            lin.bias = _param(mod.bias)
        self._module(n.target, lin, {"weight": ShardSpec(f"{n.target}.weight", 1)})
        node = self._add("call_module", n.target, (x,), src=n, name=n.name)
        if self.sp:
            node = self._collective(ReduceScatterSeq, node, f"{n.target}_reduce_scatter")
        else:
            node = self._collective(ReduceFromTP, node, f"{n.target}_all_reduce")
        if mod.bias is not None:
            self.root[f"{n.target}.bias"] = lin.bias
            b = self._add("get_attr", f"{n.target}.bias", (), name=n.name + "_bias")
            if self.sp:
                b = self._collective(CopyToTP, b, f"{n.target}.bias_grad_all_reduce")
            node = self._add("call_function", operator.add, (node, b), src=n, name=n.name + "_add_bias")
        self.env[n] = node
        self.needs_grad[node] = not self.sp
        self._check(n)

    def _vocab_embedding(self, n):
        mod: nn.Embedding = self._mod(n)
        per = mod.num_embeddings // self.tp
        start = self.rank * per
        emb = VocabParallelEmbedding(per, mod.embedding_dim, start, start + per, device="meta",
                                     dtype=mod.weight.dtype)
        emb.weight = _param(mod.weight[start:start + per])
        self._module(n.target, emb, {"weight": ShardSpec(f"{n.target}.weight", 0)})
        node = self._add("call_module", n.target, (self.env[n.args[0]],), src=n, name=n.name)
        node = self._collective(ReduceFromTP, node, f"{n.target}_all_reduce")
        self.env[n] = node
        self.needs_grad[node] = True
        self._check(n)

    def _vocab_head(self, n):
        mod: nn.Linear = self._mod(n)
        x = self.env[n.args[0]]
        if self.shard_of(n.args[0]) is not None:
            raise TraceError(f"tensor-parallel rewrite: the head's input to {n.target} is sharded")
        x = self._collective(CopyToTP, x, f"{n.target}_copy_to_tp")
        lin = ColumnParallelLinear(mod.in_features, mod.out_features // self.tp, bias=mod.bias is not None,
                                   device="meta", dtype=mod.weight.dtype)
        lin.weight = _param(mod.weight.chunk(self.tp, dim=0)[self.rank])
        if mod.bias is not None:
            lin.bias = _param(mod.bias.chunk(self.tp, dim=0)[self.rank])
        self._module(n.target, lin, {"weight": ShardSpec(f"{n.target}.weight", 0),
                                     "bias": ShardSpec(f"{n.target}.bias", 0)})
        node = self._add("call_module", n.target, (x,), src=n, name=n.name)
        node = self._collective(GatherLastDim, node, f"{n.target}_gather")
        self.env[n] = node
        self.needs_grad[node] = True
        self._check(n)

    def _check(self, n):
        full, local = self.full[n], self.local[self.env[n]]
        if _is_tensor(full):
            self._shard(full, local, n)
        elif isinstance(full, (tuple, list)) and isinstance(local, (tuple, list)):
            if len(full) != len(local):
                raise TraceError(f"tensor-parallel rewrite: '{n.format_node()}' gives {len(local)} "
                                 f"parts instead of {len(full)}{_where(n)}")
            for f_, l_ in zip(full, local):
                self._shard(f_, l_, n)

    # -- the generic copy with size fixing --------------------------------------------------------
    def _generic(self, n):
        if n.op == "get_attr":
            t = _getattr_path(self.traced, n.target)
            if isinstance(t, torch.Tensor):
                t = _param(t) if isinstance(t, nn.Parameter) else t.detach().clone()
                self.root[n.target] = t
                self.names.add(n.target)
                self.specs[n.target] = ShardSpec(n.target)
                if _is_nonpersistent(self.traced, n.target):
                    self.persist_off.add(n.target)
            else:
                self.root[n.target] = t
            node = self._add("get_attr", n.target, (), src=n, name=n.name)
            self.env[n] = node
            self.needs_grad[node] = isinstance(t, nn.Parameter) and t.requires_grad
            return
        args = list(fx.node.map_arg(n.args, lambda a: self.env[a]))
        kwargs = dict(fx.node.map_arg(n.kwargs, lambda a: self.env[a]))
        if _is_size_node(n) and self.sp and n.args[0] in self.entries:
            args[0] = self.entries[n.args[0]]
        ins = [a for a in n.all_input_nodes if _is_tensor(self.full.get(a))]
        sharded = [a for a in ins if self.shard_of(a) is not None]
        if n.op == "call_module":
            mod = self._mod(n)
            has_params = any(True for _ in mod.parameters())
            if sharded and has_params:
                node = self._functional_module(n, mod, args, kwargs)
                self.env[n] = node
                self._check(n)
                return
            if isinstance(mod, nn.Dropout) and sharded:
                self._module(n.target, ShardedDropout(mod.p, self.shard_of(sharded[0]), self.tp, self.rank,
                                                      inplace=mod.inplace))
            else:
                self._module(n.target, copy.deepcopy(mod))
        elif n.op == "call_function" and n.target is F.dropout and sharded:
            kwargs = dict(kwargs)
            p_ = kwargs.pop("p", args[1] if len(args) > 1 else 0.5)
            tr = kwargs.pop("training", args[2] if len(args) > 2 else True)
            args = [args[0], p_, tr, self.shard_of(sharded[0]), self.tp, self.rank]
            kwargs = {}
            node = self._add("call_function", sharded_dropout, args, src=n, name=n.name)
            self.env[n] = node
            self.needs_grad[node] = False
            self._check(n)
            return
        if _tensor_like(self.full[n]) and sharded:
            # a replicated tensor that needs a gradient meets a sharded one: all-reduce its grad
            def wrap(a):
                if isinstance(a, fx.Node) and self.needs_grad.get(a) and _is_tensor(self.local[a]):
                    base = (a.target if a.op == "get_attr" else a.name)
                    return self._collective(CopyToTP, a, f"{base}_grad_all_reduce")
                return a
            args = [wrap(a) for a in args]
            kwargs = {k: wrap(v) for k, v in kwargs.items()}
        if _tensor_like(self.full[n]):
            args, kwargs = self._fix_sizes(n, args, kwargs)
        node = self._add(n.op, n.target, args, kwargs, src=n, name=n.name)
        self.env[n] = node
        self.needs_grad[node] = (_is_tensor(self.local[node]) and not sharded
                                 and (any(self.needs_grad.get(self.env[a]) for a in ins)
                                      or (n.op == "call_module" and any(True for _ in self._mod(n).parameters()))))
        self._check(n)

    def _functional_module(self, n, mod, args, kwargs):
        """A leaf module with parameters on sharded activations: call it functionally, each
        parameter through CopyToTP (its gradient is partial on each rank)."""
        params = {}
        for pname, p in mod.named_parameters():
            qual = f"{n.target}.{pname}"
            self.root[qual] = _param(p)
            self.names.add(qual)
            self.specs[qual] = ShardSpec(qual)
            g = self._add("get_attr", qual, (), name=qual.replace(".", "_"))
            params[pname] = self._collective(CopyToTP, g, f"{qual}_grad_all_reduce")
        x = args[0]
        if isinstance(mod, nn.LayerNorm):
            return self._add("call_function", F.layer_norm,
                             (x, tuple(mod.normalized_shape), params.get("weight"), params.get("bias"), mod.eps),
                             src=n, name=n.name)
        if isinstance(mod, nn.Linear) and self.shard_of(n.args[0]) != self.full[n.args[0]].dim() - 1:
            return self._add("call_function", F.linear, (x, params["weight"], params.get("bias")),
                             src=n, name=n.name)
        if hasattr(nn, "RMSNorm") and isinstance(mod, nn.RMSNorm):
            return self._add("call_function", F.rms_norm,
                             (x, tuple(mod.normalized_shape), params.get("weight"), mod.eps), src=n, name=n.name)
        raise TraceError(f"tensor-parallel rewrite: module {n.target} ({type(mod).__name__}) runs on a "
                         f"sharded tensor and is not supported there{_where(n)}")

    def _fix_sizes(self, n, args, kwargs):
        """Rewrite size arguments of shape-consuming ops to the local shard's values."""
        op, tgt = n.op, n.target
        a0 = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        if a0 is None or not _is_tensor(self.full.get(a0)):
            return args, kwargs
        full_in = self.full[a0]
        sd = self.shard_of(a0)
        name = tgt if op == "call_method" else getattr(tgt, "__name__", "")
        if name in ("view", "reshape") and (op == "call_method" or tgt is torch.reshape):
            sizes, packed = (args[1], True) if len(args) == 2 and isinstance(args[1], (tuple, list)) else (args[1:], False)
            out_full = tuple(self.full[n].shape)
            expected = list(out_full)
            if sd is not None and a0 in self.segments and len(self.segments[a0]) > 1 and self._fused_view_parts(n):
                j = full_in.dim()   # (..., k, H, D): the heads of each fused part are split
                if out_full[j] % self.tp:
                    raise PlanError(f"plan field 'tp'={self.tp} does not divide heads={out_full[j]}{_where(n)}")
                expected[j] //= self.tp
            elif sd is not None:
                j = self._view_dim(full_in.shape, sd, out_full, n)
                if out_full[j] % self.tp:
                    raise PlanError(f"plan field 'tp'={self.tp} does not divide the size {out_full[j]} "
                                    f"that {n.name} splits{_where(n)}")
                expected[j] //= self.tp
            sizes = self._fix_list(sizes, expected, n)
            args = [args[0], tuple(sizes)] if packed else [args[0], *sizes]
        elif name == "expand" and op == "call_method":
            sizes, packed = (args[1], True) if len(args) == 2 and isinstance(args[1], (tuple, list)) else (args[1:], False)
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
            if self._has_node(n.args[1]):
                args[1] = self._fix_index(n, args[1], sd)
        else:
            # any other op taking symbolic ints (arange, new_zeros, ...): they must keep serial values
            def fix(a, orig):
                if isinstance(orig, fx.Node) and isinstance(self.full.get(orig), int) and not isinstance(self.full.get(orig), bool):
                    return self._fix_list([a], [self.full[orig]], n)[0]
                return a
            args = [fix(a, o) for a, o in zip(args, n.args)]
        return args, kwargs

    @staticmethod
    def _has_node(idx):
        found = []
        fx.node.map_arg(idx, lambda a: found.append(a))
        return bool(found)

    def _fix_index(self, n, idx, sd):
        """Slice bounds that are symbolic ints keep their serial values (a sliced sharded dim is
        not supported)."""
        items = list(idx) if isinstance(idx, tuple) else [idx]
        orig = list(n.args[1]) if isinstance(n.args[1], tuple) else [n.args[1]]
        out = []
        for new_it, old_it in zip(items, orig):
            if isinstance(old_it, slice):
                parts = []
                for nb, ob in ((new_it.start, old_it.start), (new_it.stop, old_it.stop), (new_it.step, old_it.step)):
                    if isinstance(ob, fx.Node) and isinstance(self.full.get(ob), int):
                        nb = self._fix_list([nb], [self.full[ob]], n)[0]
                    parts.append(nb)
                out.append(slice(*parts))
            elif isinstance(old_it, fx.Node) and isinstance(self.full.get(old_it), int):
                out.append(self._fix_list([new_it], [self.full[old_it]], n)[0])
            else:
                out.append(new_it)
        return tuple(out) if isinstance(idx, tuple) else out[0]

    def _view_dim(self, in_shape, sd, out_shape, n):
        prefix = math.prod(in_shape[:sd])
        for j in range(len(out_shape)):
            if math.prod(out_shape[:j]) == prefix and out_shape[j] != 1:
                return j
        raise TraceError(f"tensor-parallel rewrite: '{n.format_node()}' merges the split dim {sd} of "
                         f"{tuple(in_shape)} with an outer dim ({tuple(out_shape)}); keep the head "
                         f"dim separate{_where(n)}")

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


def _reaches(a: fx.Node, b: fx.Node) -> bool:
    stack, seen = [a], set()
    while stack:
        x = stack.pop()
        if x is b:
            return True
        if x in seen:
            continue
        seen.add(x)
        stack.extend(x.users)
    return False


def _getattr_path(obj, path: str):
    for p in path.split("."):
        obj = getattr(obj, p)
    return obj


def _is_nonpersistent(root: nn.Module, path: str) -> bool:
    owner, _, leaf = path.rpartition(".")
    try:
        mod = root.get_submodule(owner) if owner else root
    except AttributeError:
        return False
    return leaf in getattr(mod, "_non_persistent_buffers_set", ())


def _has_tensor(gm: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    try:
        mod = gm.get_submodule(owner) if owner else gm
    except AttributeError:
        return False
    return leaf in mod._parameters or leaf in mod._buffers


# ---- entry point -----------------------------------------------------------------------------------

def rewrite_row(module: nn.Module, *, kind: str, tp_rank: int, tp_size: int, tp_group,
                sequence_parallel: bool, recompute: str, example_input=None) -> fx.GraphModule:
    """This rank's shard of one layer-table row as a torch.fx GraphModule (see docs/CONTRACTS.md,
    "Rewrite API")."""
    if kind not in KINDS:
        raise PlanError(f"rewrite_row: kind={kind!r} is not one of {list(KINDS)}")
    if recompute not in RECOMPUTE:
        raise PlanError(f"plan field 'recompute'={recompute!r} is not one of {list(RECOMPUTE)}")
    tp_size = int(tp_size)
    if tp_group is None:
        tp_group = FakeGroup(tp_rank, tp_size)
    if group_size(tp_group) != tp_size or group_rank(tp_group) != tp_rank:
        raise PlanError(f"rewrite_row: tp_group has rank {group_rank(tp_group)} of "
                        f"{group_size(tp_group)} but tp_rank={tp_rank}, tp_size={tp_size}")
    if sequence_parallel and tp_size < 2:
        sequence_parallel = False
    if example_input is None:
        example_input = infer_example_input(module, kind, tp_size)
    rw = _Rewriter(module, kind, tp_rank, tp_size, tp_group, bool(sequence_parallel), example_input)
    gm = rw.run()
    gm.autopar_info = {"kind": kind, "tp_rank": tp_rank, "tp_size": tp_size,
                       "sequence_parallel": bool(sequence_parallel), "recompute": recompute,
                       "pairs": {r.target: {"columns": [c.target for c in cols], "kind": rw.pair_kind[r],
                                            "segments": {c.target: list(rw.segments[c]) for c in cols}}
                                 for r, cols in rw.rows.items()},
                       "collectives": rw.coll_log,
                       "vocab_parallel": (rw.vocab_embedding or rw.vocab_head).target
                       if (rw.vocab_embedding or rw.vocab_head) is not None else None}
    from autopar.rewrite.recompute import apply_recompute
    return apply_recompute(gm, recompute)
