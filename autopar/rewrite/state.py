"""Rebuilding the serial row's state dict from tp shards, and listing a row's collectives."""
from __future__ import annotations

import torch
import torch.nn as nn

from autopar.rewrite.collectives import _Collective, all_gather_along_dim, group_size


def _unshard(parts: list[torch.Tensor], dim: int, segments) -> torch.Tensor:
    if not segments:
        return torch.cat(parts, dim=dim)
    tp = len(parts)
    local_sizes = [s // tp for s in segments]
    split = [p.split(local_sizes, dim=dim) for p in parts]
    return torch.cat([torch.cat([split[r][i] for r in range(tp)], dim=dim)
                      for i in range(len(segments))], dim=dim)


def gather_row_state_dict(gm: nn.Module, tp_group, grads: bool = False) -> dict[str, torch.Tensor]:
    """{name in the original row: full tensor} from every tp rank's shard (a collective over tp:
    call it on all tp ranks). Covers parameters and persistent buffers; with ``grads=True`` the
    parameters' ``.grad`` instead (parameters without a grad are left out)."""
    specs = getattr(gm, "autopar_shards", None)
    if grads:
        sd = {n: p.grad for n, p in gm.named_parameters() if p.grad is not None}
    else:
        sd = gm.state_dict()
    if specs is None:
        return {k: v.detach().clone() for k, v in sd.items()}
    n = group_size(tp_group)
    out = {}
    for local_name, spec in specs.items():
        if local_name not in sd:
            continue
        t = sd[local_name].detach()
        if spec.dim is None or n == 1:
            out[spec.name] = t.clone()
            continue
        gathered = all_gather_along_dim(t.contiguous(), spec.dim, tp_group)
        parts = list(gathered.chunk(n, dim=spec.dim))
        out[spec.name] = _unshard(parts, spec.dim, spec.segments)
    return out


def collectives_of(gm: nn.Module) -> list[dict]:
    """Every collective a rewritten row runs, in graph order: {name, module, fwd, bwd, input}."""
    out = []

    def walk(mod: nn.Module, prefix: str):
        graph = getattr(mod, "graph", None)
        if graph is None:
            return
        for node in graph.nodes:
            if node.op == "call_module":
                sub = mod.get_submodule(node.target)
                if isinstance(sub, _Collective):
                    arg = node.args[0]
                    out.append({"name": prefix + node.target, "module": type(sub).__name__,
                                "fwd": sub.fwd, "bwd": sub.bwd,
                                "input": getattr(arg, "name", str(arg))})
            elif node.op == "get_attr":
                sub = getattr(mod, node.target, None) if "." not in node.target else None
                if isinstance(sub, nn.Module):
                    walk(sub, prefix + node.target + ".")
    walk(gm, "")
    return out
