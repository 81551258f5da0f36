"""Which linears of a serial row become column / row parallel, and which are vocab parallel.

This is the analysis half of the tensor-parallel rewrite: it reads the traced serial graph and
its full (meta) values and decides the layout; ``autopar.rewrite.tp`` then rebuilds the graph on
the local shard. A **Megatron pair** is a row-parallel linear R and the column-parallel linears
reached backwards from R's input through tensor ops only (no residual, no other linear, no row
input), whose outputs flow nowhere but into R. A fused qkv output (``split``/``chunk`` along its
last dim, or a ``reshape`` to (..., k, H, D)) gives the segments its weight is cut by. Plans whose
tp does not divide a pair's heads / ffn fail here with the tp values that would work.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.rewrite.fx_util import divisors, is_size_node, is_tensor, tensor_like, where
from autopar.rewrite.shard_layers import is_conv1d, out_features
from autopar.trace.fx_graph import ABORT, EXPAND, INPUTS, PRUNE, is_linear_module, is_softmax, reaches, walk
from autopar.trace.tp import find_tp_pairs
from costmodels.contracts.errors import PlanError


@dataclass
class ParallelLayout:
    """The decided layout of one row (nodes of the serial graph)."""
    cols: dict = field(default_factory=dict)         # column node -> its row node
    rows: dict = field(default_factory=dict)         # row node -> [column nodes], graph order
    segments: dict = field(default_factory=dict)     # column node -> full output segment sizes
    pair_kind: dict = field(default_factory=dict)    # row node -> "attention" | "mlp"
    vocab_embedding: fx.Node | None = None
    vocab_head: fx.Node | None = None


def find_layout(traced: fx.GraphModule, full: dict, kind: str, tp: int, row_name: str) -> ParallelLayout:
    """The pairs of a block row, or the vocab-parallel embedding / head of an embedding / head
    row (none when tp is 1). ``row_name`` (the row's class) goes into error messages."""
    finder = _PairFinder(traced, full, kind, tp, row_name)
    finder.find_pairs()
    finder.check_trace_pairs()
    finder.find_vocab()
    return finder.layout


def fused_view_parts(u: fx.Node, full: dict) -> int:
    """k when ``u`` reshapes a fused column output (..., k·H·D) into (..., k, H, D), k in 2, 3
    (timm / many user codes: ``qkv.reshape(B, N, 3, H, D)``); else 0."""
    if not (u.op == "call_method" and u.target in ("view", "reshape")) and not (
            u.op == "call_function" and u.target is torch.reshape):
        return 0
    a = u.args[0]
    if not isinstance(a, fx.Node) or not is_tensor(full.get(a)) or not is_tensor(full.get(u)):
        return 0
    src, out = tuple(full[a].shape), tuple(full[u].shape)
    if len(out) == len(src) + 2 and out[:len(src) - 1] == src[:-1] and out[len(src) - 1] in (2, 3):
        return out[len(src) - 1]
    return 0


_FUNC_NAMES = {F.linear: "F.linear", torch.addmm: "torch.addmm"}


def _is_attention_op(gm: fx.GraphModule, n: fx.Node) -> bool:
    """Softmax as the trace (cost model) recognises it, or fused attention."""
    if n.op == "call_function" and n.target is F.scaled_dot_product_attention:
        return True
    return is_softmax(gm, n)


_RESHAPES = {"view", "reshape", "flatten", "contiguous", "long", "int", "to"}


def _is_row_input(x) -> bool:
    """The row's input, possibly reshaped first (GPT-2's ``input_ids.view(-1, T)``)."""
    while isinstance(x, fx.Node) and x.op == "call_method" and x.target in _RESHAPES and x.args:
        x = x.args[0]
    return isinstance(x, fx.Node) and x.op == "placeholder"


def _sliced_segments(c: fx.Node, full: dict, out: int) -> tuple:
    """The parts of fused output ``c`` that its users slice out of the last dim (Phi-3:
    ``qkv[..., :q]``, ``qkv[..., q:q + kv]``, ``qkv[..., q + kv:]``), or ``(out,)``."""
    from autopar.rewrite.head_shards import index_dims
    bounds = {0, out}
    for u in c.users:
        if not (u.op == "call_function" and u.target is operator.getitem):
            continue
        items = list(u.args[1]) if isinstance(u.args[1], tuple) else [u.args[1]]
        nd = full[c].dim()
        dims = index_dims(items, nd)
        if nd - 1 not in dims or not isinstance(items[dims.index(nd - 1)], slice):
            continue
        sl = items[dims.index(nd - 1)]
        vals = [full[b] if isinstance(b, fx.Node) else b for b in (sl.start, sl.stop, sl.step)]
        if vals[2] not in (None, 1) or not all(isinstance(v, (int, type(None))) for v in vals[:2]):
            return (out,)
        bounds.update(v % out if v < 0 else min(v, out) for v in vals[:2] if v is not None)
    cuts = sorted(bounds)
    return tuple(b - a for a, b in zip(cuts, cuts[1:]))


class _PairFinder:
    def __init__(self, traced: fx.GraphModule, full: dict, kind: str, tp: int, row_name: str):
        self.traced, self.graph, self.full, self.kind, self.tp = traced, traced.graph, full, kind, tp
        self.row_name = row_name
        self.layout = ParallelLayout()

    def _mod(self, n):
        return self.traced.get_submodule(n.target) if n.op == "call_module" else None

    def _is_linear(self, n):
        return n.op == "call_module" and (isinstance(self._mod(n), nn.Linear) or is_conv1d(self._mod(n)))

    def find_pairs(self):
        lay = self.layout
        if self.kind != "block" or self.tp == 1:
            return
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        used = set()
        for r in self.graph.nodes:
            if not self._is_linear(r) or r in used:
                continue
            cols, region = self._columns_before(r)
            if cols is None or not cols or any(c in used for c in cols):
                continue
            if not self._contained(cols, r, region):
                continue
            cols.sort(key=order.__getitem__)
            used.update(cols)
            used.add(r)
            lay.rows[r] = cols
            for c in cols:
                lay.cols[c] = r
                lay.segments[c] = self._segments_of(c)
            attention = any(_is_attention_op(self.traced, a) for a in region)
            lay.pair_kind[r] = "attention" if attention else "mlp"
            self._check_divisible(cols, region, attention)

    def check_trace_pairs(self):
        """The trace (and so the cost model) also counts pairs built from ``F.linear``,
        ``torch.addmm`` or HF ``Conv1D``; this rewrite shards only ``nn.Linear`` modules, so such
        a pair would run replicated while costed as sharded: refuse it in one line instead."""
        if self.kind != "block" or self.tp == 1:
            return
        added = [n for n in self.graph.nodes if "val" not in n.meta and is_tensor(self.full.get(n))]
        for n in added:
            n.meta["val"] = self.full[n]
        try:
            pairs = find_tp_pairs(self.traced)
        finally:
            for n in added:
                del n.meta["val"]
        by_name = {n.name: n for n in self.graph.nodes}
        sharded = {r.name for r in self.layout.rows}
        for p in pairs:
            if p.row_node in sharded:
                continue
            for name in (*p.column_nodes, p.row_node):
                n = by_name[name]
                if not self._is_linear(n):
                    what = (type(self._mod(n)).__name__ if n.op == "call_module" and
                            is_linear_module(self._mod(n)) else _FUNC_NAMES.get(n.target, str(n.target)))
                    raise PlanError(f"plan field 'tp'={self.tp}: {self.row_name} applies a weight with "
                                    f"{what}{where(n)}, which the tensor-parallel rewrite cannot shard "
                                    "(only nn.Linear modules); use tp=1 or make it an nn.Linear")

    def _columns_before(self, r):
        """(linears reached backwards from ``r``'s input through tensor ops, the ops between);
        cols None when a row input is reached (``r`` is then no row-parallel linear)."""
        cols, region = [], set()
        first = next((n for n in self.graph.nodes if n.op == "placeholder"), None)

        def visit(a):
            if not tensor_like(self.full.get(a)) or is_size_node(a) or a.op == "get_attr":
                return PRUNE
            if self._is_linear(a):
                cols.append(a)
                return PRUNE
            if a.op == "placeholder":   # the hidden state: no pair; a float side input (T5's position
                side = a is not first and is_tensor(self.full.get(a)) and self.full[a].is_floating_point()
                return PRUNE if side else ABORT   # bias) is kept; a mask from the ids is not (see README)
            region.add(a)
            return EXPAND

        return (cols if walk([r.args[0]], INPUTS, visit)[1] else None), region

    def _contained(self, cols, r, region):
        """Whether the column outputs flow only into this pair's region (and on into ``r``)."""
        def onward(a):
            return [u for u in a.users if u is not r and not is_size_node(u)]

        def visit(u):
            leaves = u.op == "output" or (u not in region and tensor_like(self.full.get(u)))
            return ABORT if leaves else EXPAND

        return all(walk(onward(c), onward, visit)[1] for c in cols)

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
            k = fused_view_parts(u, self.full)
            if k:
                return (out // k,) * k
        return _sliced_segments(c, self.full, out)

    def _check_divisible(self, cols, region, attention):
        tp, where = self.tp, self.row_name
        if not attention:
            for c in cols:
                for s in self.layout.segments[c]:
                    if s % tp:
                        raise PlanError(f"plan field 'tp'={tp} does not divide ffn={s} (the MLP's "
                                        f"hidden size, {c.target} in {where}); choose tp in {divisors(s)}")
            return
        heads = []
        for a in region:
            if a.op == "call_method" and a.target in ("view", "reshape") or (
                    a.op == "call_function" and a.target is torch.reshape):
                src, out = self.full[a.args[0]].shape, self.full[a].shape
                if len(out) == len(src) + 1 and tuple(out[:len(src) - 1]) == tuple(src[:-1]):
                    heads.append(int(out[len(src) - 1]))
                elif fused_view_parts(a, self.full):
                    heads.append(int(out[len(src)]))
        if not heads:
            return
        hq, hkv = max(heads), min(heads)
        if hq % tp:
            raise PlanError(f"plan field 'tp'={tp} does not divide heads={hq} ({where}); "
                            f"choose tp in {divisors(hq)}")
        if hkv % tp:
            raise PlanError(f"plan field 'tp'={tp} does not divide kv_heads={hkv} ({where}); "
                            f"choose tp in {divisors(hkv)}")

    def find_vocab(self):
        lay = self.layout
        if self.tp == 1:
            return
        if self.kind == "embedding":
            for n in self.graph.nodes:
                if (n.op == "call_module" and isinstance(self._mod(n), nn.Embedding)
                        and n.args and _is_row_input(n.args[0])):
                    if self._mod(n).num_embeddings % self.tp == 0:
                        lay.vocab_embedding = n
                    break
        elif self.kind == "head":
            out = next(n for n in self.graph.nodes if n.op == "output")
            lin = [n for n in self.graph.nodes if self._is_linear(n) and reaches(n, out)]
            if lin and out_features(self._mod(lin[-1])) % self.tp == 0:
                lay.vocab_head = lin[-1]
