"""Copying every other node of the serial row onto the local shard.

A node that is no linear of a pair, no vocab-parallel layer and no row input/output is copied
as it is, with three adjustments: its size arguments are fixed for the shard (``sizes``); dropout
on a sharded tensor draws the serial mask (``ShardedDropout`` / ``sharded_dropout``); and a
replicated tensor that needs a gradient (a LayerNorm weight on sequence shards, a parameter
meeting a sharded activation) goes through ``CopyToTP`` so its gradient is all-reduced over tp
inside autograd. A leaf module with parameters running on a sharded tensor (LayerNorm / RMSNorm
under sequence parallel, a linear on sequence shards) is called functionally for that reason.
"""
from __future__ import annotations

import copy

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.rewrite.collectives import CopyToTP
from autopar.rewrite.fx_util import getattr_path, is_nonpersistent, is_size_node, is_tensor, tensor_like, where
from autopar.rewrite.head_shards import HeadShards
from autopar.rewrite.shard_layers import ShardedDropout, ShardSpec, as_param, sharded_dropout
from autopar.rewrite.sizes import SizeFixer
from costmodels.contracts.errors import TraceError


class GenericNodes(SizeFixer, HeadShards):
    def _generic(self, n):
        if n.op == "get_attr":
            self._get_attr(n)
            return
        args = list(fx.node.map_arg(n.args, lambda a: self.env[a]))
        kwargs = dict(fx.node.map_arg(n.kwargs, lambda a: self.env[a]))
        if is_size_node(n) and self.sp and n.args[0] in self.entries:
            args[0] = self.entries[n.args[0]]
        ins = [a for a in n.all_input_nodes if is_tensor(self.full.get(a))]
        sharded = [a for a in ins if self.shard_of(a) is not None]
        if n.op == "call_module":
            mod = self._mod(n)
            has_params = any(True for _ in mod.parameters())
            if sharded and has_params:
                self.env[n] = self._functional_module(n, mod, args)
                self._check(n)
                return
            if isinstance(mod, nn.Dropout) and sharded:
                self._refuse_strided(n, sharded, "dropout")
                self._module(n.target, ShardedDropout(mod.p, self.shard_of(sharded[0]), self.tp, self.rank,
                                                      inplace=mod.inplace))
            else:
                self._module(n.target, copy.deepcopy(mod))
        elif n.op == "call_function" and n.target is F.dropout and sharded:
            self._refuse_strided(n, sharded, "dropout")
            p_ = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            tr = kwargs.get("training", args[2] if len(args) > 2 else True)
            args = [args[0], p_, tr, self.shard_of(sharded[0]), self.tp, self.rank]
            node = self._add("call_function", sharded_dropout, args, src=n, name=n.name)
            self.env[n] = node
            self.needs_grad[node] = False
            self._check(n)
            return
        if self._reduce_over_shard(n, args, kwargs, sharded):   # OLMo-2's q/k norm: head_shards
            return
        args, kwargs = self._align_replicated(n, args, kwargs, ins, sharded)   # ALiBi, norm weights
        if tensor_like(self.full[n]) and sharded:
            # a replicated tensor that needs a gradient meets a sharded one: all-reduce its grad
            args = [self._grad_all_reduced(a) for a in args]
            kwargs = {k: self._grad_all_reduced(v) for k, v in kwargs.items()}
        if tensor_like(self.full[n]):
            args, kwargs = self._fix_sizes(n, args, kwargs)
        node = self._add(n.op, n.target, args, kwargs, src=n, name=n.name)
        self._carry_segments(n, node, sharded)
        self._carry_outer(n, node, sharded)
        self.env[n] = node
        self.needs_grad[node] = (is_tensor(self.local[node]) and not sharded
                                 and (any(self.needs_grad.get(self.env[a]) for a in ins)
                                      or (n.op == "call_module" and any(True for _ in self._mod(n).parameters()))))
        self._check(n)

    def _get_attr(self, n):
        """A parameter / buffer / constant the row reads directly: copied, replicated."""
        t = getattr_path(self.traced, n.target)
        if isinstance(t, torch.Tensor):
            t = as_param(t) if isinstance(t, nn.Parameter) else t.detach().clone()
            self.root[n.target] = t
            self.names.add(n.target)
            self.specs[n.target] = ShardSpec(n.target)
            if is_nonpersistent(self.traced, n.target):
                self.persist_off.add(n.target)
        else:
            self.root[n.target] = t
        node = self._add("get_attr", n.target, (), src=n, name=n.name)
        self.env[n] = node
        self.needs_grad[node] = isinstance(t, nn.Parameter) and t.requires_grad

    def _grad_all_reduced(self, a):
        """``a`` through CopyToTP when it is a replicated tensor that needs a gradient."""
        if isinstance(a, fx.Node) and self.needs_grad.get(a) and is_tensor(self.local[a]):
            base = (a.target if a.op == "get_attr" else a.name)
            return self._collective(CopyToTP, a, f"{base}_grad_all_reduce")
        return a

    def _functional_module(self, n, mod, args):
        """A leaf module with parameters on sharded activations: call it functionally, each
        parameter through CopyToTP (its gradient is partial on each rank)."""
        params = {}
        for pname, p in mod.named_parameters():
            qual = f"{n.target}.{pname}"
            self.root[qual] = as_param(p)
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
                         f"sharded tensor and is not supported there{where(n)}")
