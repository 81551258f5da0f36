"""Modules the tensor-parallel rewrite does not shard, refused by name before launch.

The rewrite shards a block's linears in column/row pairs and its attention through the ops it
traces (``autopar.rewrite``). Two kinds of module it cannot split: ``nn.MultiheadAttention``
(its fused in-projection and the head split happen inside one opaque call) and convolutions
(a CNN's channels are not heads). Left alone, a block built on ``nn.MultiheadAttention`` would
get its MLP sharded and its attention run whole on every rank — half-sharded, in silence — and
a CNN would run fully replicated under a plan that promises tp × less memory. Both are refused
in one line naming the module instead.
"""
from __future__ import annotations

import torch.nn as nn
from torch.nn.modules.conv import _ConvNd

from costmodels.contracts.errors import PlanError


def check_tp_modules(rows, plan) -> None:
    """Raise a one-line PlanError when ``plan`` has tp > 1 and a block row holds a module the
    rewrite cannot shard (see the module docstring)."""
    if plan.tp < 2:
        return
    for module, kind, name in zip(rows.modules, rows.kinds, rows.names):
        if kind != "block":
            continue
        for sub, m in module.named_modules():
            where = f"{name}.{sub.removeprefix('inner.')}".rstrip(".") if sub else name
            if isinstance(m, nn.MultiheadAttention):
                raise PlanError(f"plan field 'tp'={plan.tp}: {where} is an nn.MultiheadAttention, which "
                                "autopar's tensor-parallel rewrite does not shard (only the block's MLP would "
                                "be); use tp=1, or write the attention as linears and "
                                "F.scaled_dot_product_attention")
            if type(m).__name__ == "MLAttention":   # autopar/models/mla.py: no Megatron pair to shard
                from autopar.models.mla import check_mla_plan
                check_mla_plan(where, plan.tp)
            if isinstance(m, _ConvNd):
                raise PlanError(f"plan field 'tp'={plan.tp}: {where} is a {type(m).__name__}; autopar's "
                                "tensor-parallel rewrite does not shard convolutions; use tp=1 (dp, ZeRO "
                                "and pp run this model)")
