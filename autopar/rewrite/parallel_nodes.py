"""The nodes where a row's tensor-parallel layout changes, and the collectives placed there.

* the row's input (sequence parallel: a block / head receives this rank's sequence chunk; the head
  gathers it first) and output (the embedding scatters the sequence; the output's split is
  checked against the contract);
* the entry of column-parallel linears (``CopyToTP``, or ``GatherSeq`` under sequence parallel);
* column / row-parallel linears (after a row: ``ReduceFromTP``, or ``ReduceScatterSeq``; its
  bias is added once, after the reduction);
* the vocab-parallel embedding (``ReduceFromTP``) and head (``CopyToTP`` before,
  ``GatherLastDim`` after).
Every other node is copied by ``generic_nodes``.
"""
from __future__ import annotations

import inspect
import operator

import torch.fx as fx
import torch.nn as nn

from autopar.rewrite.collectives import CopyToTP, GatherLastDim, GatherSeq, ReduceFromTP, ReduceScatterSeq, ScatterSeq
from autopar.rewrite.fx_util import is_tensor, where
from autopar.rewrite.local_graph import LocalGraph
from autopar.rewrite.shard_layers import column_parallel, row_parallel, vocab_parallel
from costmodels.contracts.errors import PlanError, TraceError

SEQ_DIM = 1


class ParallelNodes(LocalGraph):
    def _check_seq_divisible(self, val):
        if val.dim() < 2 or val.shape[SEQ_DIM] % self.tp:
            raise PlanError(f"plan field 'sequence_parallel' needs the sequence length "
                            f"({val.shape[SEQ_DIM] if val.dim() > 1 else 'none'}) divisible by "
                            f"tp={self.tp}; set sequence_parallel false or change tp")

    def _placeholder(self, n, i):
        node = self.g.placeholder(n.target, default_value=n.args[0] if n.args else inspect.Signature.empty)
        node.meta = dict(n.meta)
        val = self.full[n]
        self.needs_grad[node] = is_tensor(val) and val.is_floating_point() and not (
            i == 0 and self.sp and self.kind == "block")
        if i == 0 and self.sp and self.kind in ("block", "head") and is_tensor(val):
            self._check_seq_divisible(val)
            self.local[node] = val.chunk(self.tp, dim=SEQ_DIM)[self.rank]
            if self.kind == "head":   # gather the sequence before anything of the head runs
                node = self._collective(GatherSeq, node, "sp_gather_input", grad="split")
                self.needs_grad[node] = True
        else:
            self.local[node] = val
        self.env[n] = node

    def _output(self, n):
        out = self.env[n.args[0]] if isinstance(n.args[0], fx.Node) else None
        if out is None and isinstance(n.args[0], (tuple, list)) and self.sp and self.tp > 1:
            self.g.output(self._output_parts(n.args[0]))
            return
        if out is None:
            self.g.output(fx.node.map_arg(n.args[0], lambda a: self.env[a]))
            return
        if self.sp and self.kind == "embedding" and self.tp > 1:
            self._check_seq_divisible(self.full[n.args[0]])
            out = self._collective(ScatterSeq, out, "sp_scatter_output")
        want = SEQ_DIM if (self.sp and self.kind in ("embedding", "block") and self.tp > 1) else None
        got = self._shard(self.full[n.args[0]], self.local[out], n)
        if got != want:
            raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: the row's output "
                             f"ends up {'replicated' if got is None else f'split on dim {got}'} instead "
                             f"of {'replicated' if want is None else f'split on dim {want}'}")
        self.g.output(out)

    def _output_parts(self, parts):
        """A row returning several tensors under sequence parallel (DeBERTa's embedding row:
        the hidden state and the relative-position embeddings): the first, the hidden state
        (``trace.cut`` puts it first), leaves on this rank's sequence chunk, the others whole."""
        out = []
        for k, a in enumerate(parts):
            if not isinstance(a, fx.Node) or not is_tensor(self.full.get(a)):
                out.append(fx.node.map_arg(a, lambda x: self.env[x]))
                continue
            node = self.env[a]
            if k == 0 and self.kind == "embedding":
                self._check_seq_divisible(self.full[a])
                node = self._collective(ScatterSeq, node, "sp_scatter_output")
            want = SEQ_DIM if k == 0 and self.kind in ("embedding", "block") else None
            got = self._shard(self.full[a], self.local[node], a)
            if got != want:
                raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: output {k} of "
                                 f"the row ends up {'replicated' if got is None else f'split on dim {got}'} "
                                 f"instead of {'replicated' if want is None else f'split on dim {want}'}")
            out.append(node)
        return type(parts)(out)

    def _entry(self, u):
        """Where the replicated input of column-parallel linears enters the tp region."""
        x = self.env[u]
        base = (next(c for c in self.layout.cols if c.args[0] is u).target.rpartition(".")[0] or "tp")
        if self.sp and (self.shard_of(u) == SEQ_DIM or self._is_flat_tokens(self.full[u])):   # flat_tokens
            node = self._seq_collective(GatherSeq, x, self.full[u], f"{base}.sp_gather", grad="reduce_scatter")
        else:
            node = self._collective(CopyToTP, x, f"{base}.copy_to_tp")
        self.entries[u] = node

    def _column(self, n):
        lin, specs = column_parallel(self._mod(n), n.target, self.layout.segments[n], self.rank, self.tp)
        self._module(n.target, lin, specs)
        self.env[n] = self._add("call_module", n.target, (self.entries[n.args[0]],), src=n, name=n.name)
        if len(self.layout.segments[n]) > 1:   # fused q/k/v: the local output is per-part (head_shards)
            self.segmented[self.env[n]] = tuple(self.layout.segments[n])
        self._check(n)

    def _row(self, n):
        mod: nn.Linear = self._mod(n)
        x = self.env[n.args[0]]
        if self.shard_of(n.args[0]) != self.full[n.args[0]].dim() - 1:
            raise TraceError(f"tensor-parallel rewrite: the input of row-parallel {n.target} is not "
                             f"split on its last dim{where(n)}")
        self._refuse_strided(n, [n.args[0]], "a row-parallel linear")
        lin, specs = row_parallel(mod, n.target, self.rank, self.tp)
        self._module(n.target, lin, specs)
        node = self._add("call_module", n.target, (x,), src=n, name=n.name)
        if self.sp:
            node = self._seq_collective(ReduceScatterSeq, node, self.full[n], f"{n.target}_reduce_scatter")
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
        emb, specs = vocab_parallel(self._mod(n), n.target, self.rank, self.tp)
        self._module(n.target, emb, specs)
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
        lin, specs = column_parallel(mod, n.target, (mod.out_features,), self.rank, self.tp)
        self._module(n.target, lin, specs)
        node = self._add("call_module", n.target, (x,), src=n, name=n.name)
        node = self._collective(GatherLastDim, node, f"{n.target}_gather")
        self.env[n] = node
        self.needs_grad[node] = True
        self._check(n)
