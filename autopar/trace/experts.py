"""The Mixture-of-Experts facts of each row (``LayerRow.expert_params`` ... ``expert_fwd_flops``).

A MoE layer is recognised by what the common implementations share, not by class name: a module
with a child ``experts`` (autopar's ``Experts``, transformers' Mixtral / Qwen2-MoE / Qwen3-MoE /
DeepSeek-V3 expert lists or stacked-weight modules, torchtitan's ``GroupedExperts``) and a top-k
(``top_k`` / ``num_experts_per_tok`` on the layer, its ``router`` or its ``gate``). Its routed
experts are the parameters of ``experts``; the shared experts and the router stay dense.

The FLOPs of the routed experts actually run are ``2·routed·expert_params / E`` (each expert's
weights are used once per token routed to it: a multiply and an add), with
``routed = b·s·top_k`` the token-expert assignments of one micro-batch.
"""
from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

_TOPK_NAMES = ("top_k", "num_experts_per_tok", "topk", "k")
_COUNT_NAMES = ("num_experts", "n_routed_experts", "num_local_experts", "experts_count")


def _attr(mods, names):
    for m in mods:
        for n in names:
            v = getattr(m, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
            cfg = getattr(m, "config", None)
            v = getattr(cfg, n, None) if cfg is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def moe_layers(module: nn.Module) -> list[tuple[int, int, int]]:
    """[(experts, top_k, routed-expert parameters)] of the MoE layers inside ``module``."""
    found = []
    for m in module.modules():
        experts = getattr(m, "experts", None)
        if not isinstance(experts, nn.Module):
            continue
        helpers = [m] + [getattr(m, n) for n in ("router", "gate") if isinstance(getattr(m, n, None), nn.Module)]
        k = _attr(helpers, _TOPK_NAMES)
        e = _attr([experts] + helpers, _COUNT_NAMES)
        if e is None and isinstance(experts, (nn.ModuleList, nn.ModuleDict)):
            e = len(experts)
        if k is None or e is None:
            continue
        found.append((e, k, sum(p.numel() for p in experts.parameters())))
    return found


def with_expert_facts(rows: tuple, model: nn.Module, micro_batch: int, seq: int,
                      hidden: int | None, dtype_bytes: int) -> tuple:
    """``rows`` with the MoE fields of every row whose module holds MoE layers."""
    out = []
    for row in rows:
        try:
            mod = model.get_submodule(row.name) if row.kind == "block" else None
        except AttributeError:
            mod = None
        layers = moe_layers(mod) if mod is not None else []
        if not layers:
            out.append(row)
            continue
        routed = sum(micro_batch * seq * k for _, k, _ in layers)
        flops = sum(2.0 * micro_batch * seq * k * p / e for e, k, p in layers)
        out.append(replace(row, expert_params=int(sum(p for _, _, p in layers)),
                           experts=int(max(e for e, _, _ in layers)), routed_tokens=int(routed),
                           dispatch_bytes=int(routed * (hidden or 0) * dtype_bytes),
                           expert_fwd_flops=float(min(flops, row.fwd_flops))))
    return tuple(out)


def expert_leaf_classes(model: nn.Module) -> tuple[str, ...]:
    """Class names of the ``experts`` modules of ``model``'s MoE layers to trace as leaves: their
    forward routes on tensor values (transformers' loop over the experts hit, torchtitan's
    token-group padding), which a meta trace cannot follow; run whole on meta they count the
    FLOPs of the k of E experts each token runs (grouped GEMMs). autopar's own ``Experts``
    traces as it is (its routing is balanced on meta, autopar/models/moe.py)."""
    from autopar.models.moe import Experts
    names = []
    for m in model.modules():
        experts = getattr(m, "experts", None)
        if isinstance(experts, nn.Module) and not isinstance(experts, (Experts, nn.ModuleList, nn.ModuleDict)) \
                and moe_layers(m) and type(experts).__name__ not in names:
            names.append(type(experts).__name__)
    return tuple(names)
