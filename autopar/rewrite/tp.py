"""Tensor- and sequence-parallel rewrite of one row, as torch.fx passes.

How it works (``rewrite_row`` → ``_Rewriter.run``; each step names the module doing it):

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

Layout of the code: ``shard_layers`` (sharded modules, weight cutting, ShardSpec), ``fx_util``
(tracing, meta execution), ``pairs`` (step 3), ``local_graph`` (the graph of step 4 and its
shape checks), ``parallel_nodes`` (nodes where the layout changes and their collectives),
``generic_nodes`` (every other node), ``sizes`` (size-argument rewriting) and ``head_shards``
(tensors indexed by head that are no linear's output: slices of a fused qkv, norms over the
projected width, ALiBi / relative-position tensors, batch merged into heads); this module joins
them and holds the public entry point.
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.rewrite.collectives import FakeGroup, group_rank, group_size
from autopar.rewrite.experts import ExpertNodes
from autopar.rewrite.flat_tokens import FlatTokens
from autopar.rewrite.fx_util import drop_stale_fx_wraps, has_tensor, owner_of, serial_values, trace_row, where
from autopar.rewrite.generic_nodes import GenericNodes
from autopar.rewrite.pairs import find_layout
from autopar.rewrite.parallel_nodes import SEQ_DIM, ParallelNodes
from autopar.rewrite.recompute import apply_recompute
from autopar.rewrite.shard_layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    ShardedDropout,
    ShardSpec,
    VocabParallelEmbedding,
    sharded_dropout,
)
from autopar.rewrite.vocab_tables import VocabNodes, find_vocab_table
from costmodels.contracts.errors import PlanError, TraceError

__all__ = ["rewrite_row", "infer_example_input", "ShardSpec", "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "ShardedDropout", "sharded_dropout", "drop_stale_fx_wraps", "trace_row",
           "KINDS", "RECOMPUTE", "SEQ_DIM"]

KINDS = ("embedding", "block", "head")
RECOMPUTE = ("none", "selective", "full")


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


class _Rewriter(ExpertNodes, VocabNodes, FlatTokens, ParallelNodes, GenericNodes):
    """One row's rewrite: serial values, layout, then the local graph node by node."""

    def _serial_failure(self, n, e):
        return TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: op "
                          f"'{n.format_node()}' fails on the local shard{where(n)}: "
                          f"{type(e).__name__}: {e}")

    def run(self) -> fx.GraphModule:
        self.full = serial_values(self.traced, self.example, self._serial_failure)
        self.layout = find_layout(self.traced, self.full, self.kind, self.tp, type(self.module).__name__)
        lay = self.layout
        vocab = find_vocab_table(self.traced, self.full, self.kind, self.tp)   # every lookup of the table
        if vocab.lookups:
            lay.vocab_embedding = vocab.lookups[0]
        col_inputs = {c.args[0] for c in lay.cols}
        phs = [n for n in self.old.nodes if n.op == "placeholder"]
        for n in self.old.nodes:
            if n.op == "placeholder":
                self._placeholder(n, phs.index(n))
            elif n.op == "output":
                self._output(n)
            elif n in vocab.weights:
                self._vocab_weight(n)
            elif n in vocab.lookups:
                self._vocab_lookup(n)
            elif n in lay.cols:
                self._column(n)
            elif n in lay.rows:
                self._row(n)
            elif n is lay.vocab_embedding:
                self._vocab_embedding(n)
            elif n is lay.vocab_head:
                self._vocab_head(n)
            elif self._is_expert_leaf(n):   # a MoE's routed experts (autopar.rewrite.experts)
                self._experts(n)
            else:
                self._generic(n)
            if n in col_inputs:
                self._entry(n)
        self.g.lint()
        gm = fx.GraphModule(self.root, self.g, class_name=type(self.module).__name__ + "Shard")
        for name in self.persist_off:
            mod, leaf = owner_of(gm, name)
            if mod is not None and leaf in mod._buffers:
                mod._non_persistent_buffers_set.add(leaf)
        gm.autopar_shards = {k: v for k, v in self.specs.items() if has_tensor(gm, k)}
        return gm


# ---- entry point -----------------------------------------------------------------------------------

def rewrite_row(module: nn.Module, *, kind: str, tp_rank: int, tp_size: int, tp_group,
                sequence_parallel: bool, recompute: str, example_input=None,
                context_parallel=None) -> fx.GraphModule:
    """This rank's shard of one layer-table row as a torch.fx GraphModule (see docs/CONTRACTS.md,
    "Rewrite API"). ``context_parallel``: ``autopar.rewrite.context_parallel.CPRow`` (cp > 1),
    applied after the tensor-parallel pass and before recompute."""
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
    lay = rw.layout
    vocab = lay.vocab_embedding if lay.vocab_embedding is not None else lay.vocab_head
    gm.autopar_info = {"kind": kind, "tp_rank": tp_rank, "tp_size": tp_size,
                       "sequence_parallel": bool(sequence_parallel), "recompute": recompute,
                       "pairs": {r.target: {"columns": [c.target for c in cols], "kind": lay.pair_kind[r],
                                            "segments": {c.target: list(lay.segments[c]) for c in cols}}
                                 for r, cols in lay.rows.items()},
                       "collectives": rw.coll_log,
                       "vocab_parallel": vocab.target if vocab is not None else None}
    if context_parallel is not None:
        from autopar.rewrite.context_parallel import apply_context_parallel
        gm = apply_context_parallel(gm, kind=kind, **context_parallel)
    return apply_recompute(gm, recompute)
