"""Every lookup into an embedding row's vocabulary table, made vocab-parallel (Megatron's
``VocabParallelEmbedding``: each tp rank holds rows ``[start, end)`` of the table, looks up the
ids it holds, zeroes the others, and the partial results are all-reduced).

The table of an embedding row is the one its first lookup on the row's input reads. Two shapes
of model need more than that one lookup made parallel:

* **functional lookups** — a subclass of ``nn.Embedding`` that torch.fx traces through (Gemma's
  ``GemmaTextScaledWordEmbedding`` multiplies the lookup by ``sqrt(hidden)``) leaves an
  ``F.embedding(ids, <get_attr weight>)`` in the graph, not a module call: the weight's
  ``get_attr`` is cut to this rank's rows and the call becomes :func:`vocab_parallel_lookup`;
* **one table, several lookups** — T5's encoder and decoder read one shared table (the decoder
  on the ids shifted right, not on the row input): every lookup into the same tensor with
  integer ids is made parallel, so the table is split one way in the whole row.

The LM head tied to the table is the vocab-parallel head of ``parallel_nodes`` (rows of the same
weight, so both uses hold one shard: the runtime ties them into one Parameter on a rank, whose
gradient autograd sums from both uses; across pipeline ranks ``all_reduce_tied`` sums them). A
table that cannot be cut this way (its rows not divisible by tp, its weight read by something
other than a lookup, ``max_norm`` renormalising it) stays replicated, as before.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.rewrite import pairs
from autopar.rewrite.collectives import ReduceFromTP
from autopar.rewrite.fx_util import getattr_path, is_tensor
from autopar.rewrite.shard_layers import ShardSpec, as_param


@dataclass
class VocabTable:
    """The lookups of one row's vocabulary table (serial nodes, graph order) and the
    ``get_attr`` nodes of its weight that functional lookups read."""
    lookups: list = field(default_factory=list)
    weights: set = field(default_factory=set)


def vocab_parallel_lookup(ids, weight, vocab_start: int, vocab_end: int, serial_padding_idx=None):
    """``F.embedding`` of this rank's rows ``[vocab_start, vocab_end)`` of the table (``weight``);
    ids outside give zeros, to be summed over tp. The serial ``padding_idx`` row gets no gradient
    here either, when this rank holds it."""
    outside = (ids < vocab_start) | (ids >= vocab_end)
    local = (ids - vocab_start).masked_fill(outside, 0)
    pad = serial_padding_idx
    pad = pad - vocab_start if pad is not None and vocab_start <= pad < vocab_end else None
    return F.embedding(local, weight, padding_idx=pad).masked_fill(outside.unsqueeze(-1), 0.0)


def _functional_kw(n: fx.Node, name: str, pos: int, default=None):
    return n.kwargs.get(name, n.args[pos] if len(n.args) > pos else default)


def _table(traced: fx.GraphModule, n: fx.Node):
    """The weight tensor a lookup node reads, or None when ``n`` is no plain lookup."""
    if n.op == "call_module":
        mod = traced.get_submodule(n.target)
        return mod.weight if isinstance(mod, nn.Embedding) and mod.max_norm is None else None
    if n.op == "call_function" and n.target is F.embedding and len(n.args) > 1:
        w = n.args[1]
        if isinstance(w, fx.Node) and w.op == "get_attr" and _functional_kw(n, "max_norm", 3) is None:
            return getattr_path(traced, w.target)
    return None


def find_vocab_table(traced: fx.GraphModule, full: dict, kind: str, tp: int) -> VocabTable:
    """The lookups to make vocab-parallel in an embedding row (none under tp = 1, in other rows,
    or when the table cannot be cut; see the module docstring)."""
    if kind != "embedding" or tp == 1:
        return VocabTable()
    nodes = list(traced.graph.nodes)
    first = next((n for n in nodes if _table(traced, n) is not None and n.args
                  and pairs._is_row_input(n.args[0])), None)   # the row input's ids, as pairs reads them
    if first is None:
        return VocabTable()
    table = _table(traced, first)
    if table.dim() != 2 or table.shape[0] % tp:
        return VocabTable()
    lookups = [n for n in nodes if _table(traced, n) is table and is_tensor(full.get(n.args[0]))
               and not full[n.args[0]].is_floating_point()]
    weights = {n.args[1] for n in lookups if n.op == "call_function"}
    if any(u not in lookups or u.args[1] is not w for w in weights for u in w.users):
        return VocabTable()   # the weight is read by more than lookups: it stays replicated
    return VocabTable(lookups, weights)


class VocabNodes:
    """The rewrite's nodes for a row's vocabulary table (a mixin of ``tp._Rewriter``)."""

    def _vocab_rows(self, size: int) -> tuple[int, int]:
        per = size // self.tp
        return self.rank * per, (self.rank + 1) * per

    def _vocab_weight(self, n):
        """The table's ``get_attr``: this rank's rows, split on dim 0."""
        t = getattr_path(self.traced, n.target)
        start, end = self._vocab_rows(t.shape[0])
        self.root[n.target] = as_param(t[start:end], t) if isinstance(t, nn.Parameter) else t[start:end].clone()
        self.names.add(n.target)
        self.specs[n.target] = ShardSpec(n.target, 0)
        node = self._add("get_attr", n.target, (), src=n, name=n.name)
        self.env[n] = node
        self.needs_grad[node] = False   # sharded: each rank's gradient is its own rows'
        self._check(n)

    def _vocab_lookup(self, n):
        """A lookup into the table: this rank's rows, then the sum over tp (``ReduceFromTP``)."""
        if n.op == "call_module":
            if n.target in self.root:   # the same module called again: its shard is built
                node = self._add("call_module", n.target, (self.env[n.args[0]],), src=n, name=n.name)
                node = self._collective(ReduceFromTP, node, f"{n.target}_all_reduce")
                self.env[n] = node
                self.needs_grad[node] = True
                self._check(n)
                return
            self._vocab_embedding(n)
            return
        weight = n.args[1]
        start, end = self._vocab_rows(self.full[weight].shape[0])
        pad = _functional_kw(n, "padding_idx", 2)
        node = self._add("call_function", vocab_parallel_lookup,
                         (self.env[n.args[0]], self.env[weight], start, end, pad), src=n, name=n.name)
        node = self._collective(ReduceFromTP, node, f"{weight.target}_all_reduce")
        self.env[n] = node
        self.needs_grad[node] = True
        self._check(n)

