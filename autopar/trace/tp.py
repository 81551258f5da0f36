"""Find Megatron tensor-parallel pairs and the attention core in a traced block.

A linear R is the *row-parallel* half of a pair when every path back from its input reaches a
linear (the *column-parallel* halves) before it reaches the block's residual-stream input —
e.g. ``attn.c_proj`` ← softmax attention ← ``attn.c_attn``, or ``mlp.w2`` ← silu·mul ←
``mlp.w1``, ``mlp.w3``. Between the columns and R lies the *TP region*: activations there are
split over tp ranks. When the region holds a softmax between two activation matmuls it is an
attention pair; its head count is the score tensor's head dimension, and the kv head count
follows from the columns' output features (q, k, v or one fused qkv).

The *attention core* (what selective recompute drops, Korthikanti §4.2) is the score matmul's
output and everything between it and the matmul with V, exclusive.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.trace.fx_graph import (
    ABORT,
    EXPAND,
    INPUTS,
    PRUNE,
    USERS,
    ancestors,
    descendants,
    is_activation_matmul,
    is_fused_attention,
    is_linear_module,
    is_softmax,
    nearest,
    walk,
)


@dataclass
class FoundPair:
    columns: tuple[str, ...]     # module targets of the column-parallel linears
    row: str                     # module target of the row-parallel linear
    row_node: str                # fx node name of the row linear
    column_nodes: tuple[str, ...]
    heads: int | None = None
    kv_heads: int | None = None


def _out_features(m: nn.Module) -> int:
    return int(m.out_features if isinstance(m, nn.Linear) else m.nf)


def _param_arg(n: fx.Node, i: int):
    a = n.args[i] if len(n.args) > i else None
    if isinstance(a, fx.Node) and a.op == "get_attr" and isinstance(a.meta.get("val"), torch.Tensor):
        return a
    return None


def linear_info(gm: fx.GraphModule, n: fx.Node):
    """(name, out_features) when ``n`` applies a weight matrix to an activation: an nn.Linear
    (or Conv1D) module, or ``F.linear(x, W)`` / ``torch.addmm(b, x, W)`` on a parameter W."""
    if n.op == "call_module":
        try:
            m = gm.get_submodule(n.target)
        except AttributeError:
            return None
        return (n.target, _out_features(m)) if is_linear_module(m) else None
    if n.op == "call_function" and n.target in (F.linear, torch.nn.functional.linear):
        w = _param_arg(n, 1)
        if w is not None and w.meta["val"].dim() == 2:
            return w.target.rsplit(".", 1)[0], int(w.meta["val"].shape[0])
    if n.op == "call_function" and n.target in (torch.addmm,):
        w = _param_arg(n, 2)
        if w is not None and w.meta["val"].dim() == 2:
            return w.target.rsplit(".", 1)[0], int(w.meta["val"].shape[1])
    return None


def _is_linear(gm: fx.GraphModule, n: fx.Node) -> bool:
    return linear_info(gm, n) is not None


def _activation_input(gm, n: fx.Node):
    if n.op == "call_function" and n.target in (torch.addmm,):
        return n.args[1] if len(n.args) > 1 else None
    return n.args[0] if n.args else None


def _primary_inputs(gm: fx.GraphModule) -> set:
    """Placeholders carrying the residual stream: same shape as the block's output."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    vals = [a.meta.get("val") for a in out.all_input_nodes]
    shapes = {tuple(v.shape) for v in vals if isinstance(v, torch.Tensor)}
    prim = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and v.is_floating_point() and tuple(v.shape) in shapes:
                prim.add(n)
    if not prim:
        prim = {n for n in gm.graph.nodes if n.op == "placeholder"}
    return prim


def find_tp_pairs(gm: fx.GraphModule) -> list[FoundPair]:
    prim = _primary_inputs(gm)
    pairs: list[FoundPair] = []
    for r in gm.graph.nodes:
        x = _activation_input(gm, r) if _is_linear(gm, r) else None
        if not isinstance(x, fx.Node):
            continue
        cols: list[fx.Node] = []

        def visit(u, cols=cols):
            if _is_linear(gm, u):
                cols.append(u)
                return PRUNE
            if u.op == "placeholder":
                return ABORT if u in prim else PRUNE
            return PRUNE if u.op == "get_attr" else EXPAND

        if not walk([x], INPUTS, visit)[1] or not cols:
            continue
        cols.sort(key=lambda c: list(gm.graph.nodes).index(c))
        pair = FoundPair(columns=tuple(linear_info(gm, c)[0] for c in cols), row=linear_info(gm, r)[0],
                         row_node=r.name,
                         column_nodes=tuple(c.name for c in cols))
        _heads(gm, pair, cols, r)
        pairs.append(pair)
    return pairs


def _heads(gm, pair: FoundPair, cols, r) -> None:
    region = descendants(cols) & (ancestors(r))
    for s in region:   # fused attention hides the scores, not the head count: read q and k
        if is_fused_attention(s) and len(s.args) >= 2:
            q, k = (a.meta.get("val") if isinstance(a, fx.Node) else None for a in s.args[:2])
            if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() >= 4:
                pair.heads, pair.kv_heads = int(q.shape[-3]), int(k.shape[-3])
                return
    for s in region:
        if not is_activation_matmul(s):
            continue
        if not any(is_softmax(gm, d) for d in descendants([s]) & region):
            continue
        q = s.all_input_nodes[0].meta.get("val")
        out = s.meta.get("val")
        if not isinstance(q, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dim() < 3:
            continue
        d = int(q.shape[-1])
        heads = int(out.shape[-3]) if out.dim() >= 4 else None
        if heads is None:
            return
        total = sum(linear_info(gm, c)[1] for c in cols)
        kv = heads
        if d > 0 and total % d == 0:
            rest = total // d - heads
            if rest > 0 and rest % 2 == 0:
                kv = rest // 2
        pair.heads, pair.kv_heads = heads, kv
        return


def region_nodes(gm: fx.GraphModule, pairs: list[FoundPair]) -> set[str]:
    """Names of nodes whose outputs are split over tp ranks (columns up to the row input)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    names: set[str] = set()
    for p in pairs:
        cols = [by_name[c] for c in p.column_nodes]
        r = by_name[p.row_node]
        names |= {n.name for n in (descendants(cols) & ancestors(r))}
        names |= set(p.column_nodes)
    return names


def attention_core_nodes(gm: fx.GraphModule, pairs: list[FoundPair]) -> tuple[set[str], set[str]]:
    """(core node names, score-matmul node names). Storages created *inside* a score matmul
    (its copies of q and k) are not core; its output is."""
    core: set[str] = set()
    scores: set[str] = set()
    for sm in gm.graph.nodes:
        if not is_softmax(gm, sm):
            continue
        s = nearest(sm, INPUTS, is_activation_matmul)
        av = nearest(sm, USERS, is_activation_matmul)
        if s is None or av is None:
            continue
        between = (descendants([s]) & ancestors(av)) - {av}
        core |= {n.name for n in between} | {s.name}
        scores.add(s.name)
    return core, scores


def attention_mask_nodes(gm: fx.GraphModule, core: set[str]) -> set[str]:
    """Names of the nodes that build the attention mask: every user is in the attention core and
    nothing they read comes from the block's input (only buffers and constants, e.g. the causal
    ``bias == 0`` that ``masked_fill`` saves, which the traced block holds as a constant).
    Flash attention never makes them."""
    out: set[str] = set()
    for n in gm.graph.nodes:
        if n.name in core or n.op in ("placeholder", "output") or not n.users:
            continue
        if not all(u.name in core for u in n.users):
            continue
        if any(a.op == "placeholder" for a in ancestors(n)):
            continue
        out.add(n.name)
    return out
