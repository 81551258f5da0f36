"""The local (per-rank) graph the tensor-parallel rewrite builds, with its values kept on meta.

Every node added to the new graph is executed at once on ``meta`` tensors, so each node's local
shape is known while the graph grows; comparing it with the serial node's full shape tells which
dim (at most one, by a factor tp) the node is sharded on. The passes in ``parallel_nodes``,
``generic_nodes`` and ``sizes`` all add nodes through :class:`LocalGraph`, and ``tp._Rewriter``
combines them.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from autopar.rewrite.fx_util import eval_node, getattr_path, is_tensor, trace_row, where
from autopar.rewrite.pairs import ParallelLayout
from autopar.rewrite.shard_layers import ShardSpec
from costmodels.contracts.errors import TraceError


class LocalGraph:
    """State of one row's rewrite: the traced serial row (``traced``, its values ``full``, its
    ``layout``) and the local graph being built (``g``; ``env`` maps serial → new nodes, ``local``
    new nodes → meta values, ``root`` the new module's attributes, ``specs`` how each parameter
    is split)."""

    def __init__(self, module, kind, tp_rank, tp_size, group, sp, example):
        self.module, self.kind, self.rank, self.tp, self.group, self.sp = (
            module, kind, tp_rank, tp_size, group, sp)
        self.example = example if isinstance(example, tuple) else (example,)
        extra = getattr(module, "autopar_inputs", ())   # a cut row's other inputs (masks, ...)
        if len(self.example) < len(extra):
            self.example = self.example + tuple(extra[len(self.example):])
        self.traced = trace_row(module, self.example)
        self.old = self.traced.graph
        self.full: dict[fx.Node, Any] = {}
        self.layout = ParallelLayout()
        self.g = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}
        self.local: dict[fx.Node, Any] = {}
        self.root: dict[str, Any] = {}
        self.specs: dict[str, ShardSpec] = {}
        self.persist_off: set[str] = set()
        self.needs_grad: dict[fx.Node, bool] = {}   # new node -> replicated and requires grad
        self.entries: dict[fx.Node, fx.Node] = {}   # serial input of column linears -> tp entry
        self.names: set[str] = set()
        self.coll_log: list[dict] = []
        self.segmented: dict[fx.Node, tuple] = {}   # new node split per fused part -> full part sizes
        self.strided: dict[fx.Node, int] = {}       # new node whose split dim is (outer, heads) merged -> outer

    def _mod(self, n):
        return self.traced.get_submodule(n.target) if n.op == "call_module" else None

    def _name(self, base: str) -> str:
        name, i = base, 1
        while name in self.names or name in self.root:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def _add(self, op, target, args, kwargs=None, src: fx.Node | None = None, name=None):
        """Add a node to the local graph and compute its meta value."""
        node = self.g.create_node(op, target, tuple(args), dict(kwargs or {}), name=name)
        if src is not None:
            node.meta = dict(src.meta)

        def fail(e):
            at = where(src) if src is not None else ""
            return TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: "
                              f"'{(src or node).format_node()}' fails on the local shard{at}: "
                              f"{type(e).__name__}: {e}")
        self.local[node] = eval_node(node, self.local, self._root_get, self.root.__getitem__, fail)
        return node

    def _root_get(self, path):
        if path in self.root:
            return self.root[path]
        owner, _, leaf = path.rpartition(".")
        return getattr(self._root_get(owner), leaf)

    def _collective(self, cls, x, base, *cargs, **ckw):
        """Insert collective module ``cls`` on ``x`` (named after ``base``) and log its traffic."""
        name = self._name(base)
        self.root[name] = cls(self.group, *cargs, **ckw)
        node = self._add("call_module", name, (x,), name=name.replace(".", "_"))
        a, b = self.local.get(x), self.local.get(node)
        if is_tensor(a) and is_tensor(b):
            self.coll_log.append({"name": name, "module": cls.__name__, "in_shape": tuple(a.shape),
                                  "out_shape": tuple(b.shape),
                                  "bytes": max(a.numel(), b.numel()) * a.element_size()})
        return node

    def _module(self, name, mod, spec_for=None):
        """Register a leaf module under its original qualified name (params cloned)."""
        stale = self._drop_whole_copies(name)
        self.root[name] = mod
        for key in stale:   # the get_attr reads the layer's own (sharded) tensor
            self.root[key] = getattr_path(mod, key[len(name) + 1:])
        self.names.add(name)
        for pname, _ in list(mod.named_parameters()) + list(mod.named_buffers()):
            full = f"{name}.{pname}"
            self.specs.setdefault(full, (spec_for or {}).get(pname, ShardSpec(full)))
        for b in getattr(mod, "_non_persistent_buffers_set", ()):
            self.persist_off.add(f"{name}.{b}")

    def _drop_whole_copies(self, name):
        """A layer the rewrite shards whose tensors the row also reads by path (T5's
        ``if hidden.dtype != self.wo.weight.dtype``): the copy ``_get_attr`` made of the whole
        tensor would replace the shard in the GraphModule; such reads (dtype / device only) read
        the shard instead. A read of the values is refused in one line."""
        stale = [k for k, v in self.root.items() if k.startswith(name + ".") and isinstance(v, torch.Tensor)]
        for key in stale:
            reads = [u for n in self.old.nodes if n.op == "get_attr" and n.target == key for u in n.users]
            if not all(u.op == "call_function" and u.target is getattr and u.args[1] in ("dtype", "device")
                       for u in reads):
                raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: the row reads "
                                 f"{key} outside its module, which tp splits; use tp=1")
            del self.root[key]
            self.specs.pop(key, None)
            self.persist_off.discard(key)
        return stale

    def shard_of(self, old: fx.Node):
        """Sharded dim of old node's local value (None: same shape as serial)."""
        return self._shard(self.full[old], self.local[self.env[old]], old)

    def _shard(self, full, local, at: fx.Node | None = None):
        if not (is_tensor(full) and is_tensor(local)):
            return None
        if tuple(full.shape) == tuple(local.shape):
            return None
        diff = [d for d in range(full.dim()) if full.dim() == local.dim() and full.shape[d] != local.shape[d]]
        if len(diff) == 1 and local.shape[diff[0]] * self.tp == full.shape[diff[0]]:
            return diff[0]
        w = where(at) if at is not None else ""
        raise TraceError(f"tensor-parallel rewrite of {type(self.module).__name__}: local shape "
                         f"{tuple(local.shape)} does not match serial shape {tuple(full.shape)} split "
                         f"by tp={self.tp}{w}")

    def _check(self, n):
        """Raise unless serial node ``n``'s local value is its full value split by tp on ≤ 1 dim."""
        full, local = self.full[n], self.local[self.env[n]]
        if is_tensor(full):
            self._shard(full, local, n)
        elif isinstance(full, (tuple, list)) and isinstance(local, (tuple, list)):
            if len(full) != len(local):
                raise TraceError(f"tensor-parallel rewrite: '{n.format_node()}' gives {len(local)} "
                                 f"parts instead of {len(full)}{where(n)}")
            for f_, l_ in zip(full, local):
                self._shard(f_, l_, n)
