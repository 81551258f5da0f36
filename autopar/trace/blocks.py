"""Rows of the trace: the model's repeated blocks, their structural groups, and which top-level
fx node belongs to which row.

Kept apart from the driver (``autopar.trace.driver``) because this is the part that decides the
layer table's row structure — embedding, one row per block call, head — and which blocks share a
measurement: blocks with the same structure (module types, simple attributes, parameter and
buffer shapes) called on the same input signature cost the same, so only the first is measured.
"""
from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

WRAPPER_PREFIX = "inner."  # trace_call wraps the model in a CallWrapper whose ``inner`` it is


def module_path(target: str) -> str:
    """A traced target's path in the user's model (without the CallWrapper's ``inner.``)."""
    return target[len(WRAPPER_PREFIX):] if target.startswith(WRAPPER_PREFIX) else target


@dataclass
class RowInfo:
    name: str
    kind: str
    module: nn.Module | None = None      # the block module (None for embedding / head)
    group: Any = None                    # (structural group, input signature) of a block
    rep: int | None = None               # row index of the measured block of its group
    call_node: fx.Node | None = None     # the top-level call_module node of a block


def find_block_list(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The largest ModuleList, Sequential or ModuleDict (by parameters, then length) whose
    children share one class (torchtitan keeps its blocks in a ModuleDict keyed "0", "1", …)."""
    best, best_key = None, None
    for name, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) or len(m) == 0 or m is model:
            continue
        classes = Counter(type(c) for c in block_modules(m))
        if len(classes) != 1:
            continue
        params = sum(p.numel() for p in m.parameters())
        key = (params, len(m), -name.count("."))
        if best_key is None or key > best_key:
            best, best_key = (name, m), key
    return best


def block_modules(container: nn.Module) -> list[nn.Module]:
    """The blocks of a block list in order (a ModuleDict's values, in insertion order)."""
    return list(container.values()) if isinstance(container, nn.ModuleDict) else list(container)


def _simple_attrs(m: nn.Module) -> tuple:
    out = []
    for k, v in vars(m).items():
        if k.startswith("_") or "idx" in k or "index" in k or k in ("layer_id", "layer_number"):
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            out.append((k, v))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def structure_key(m: nn.Module) -> tuple:
    """Equal for blocks that run the same code on the same shapes (a layer index is ignored)."""
    items = []
    for name, sub in m.named_modules():
        items.append((name, type(sub).__qualname__, _simple_attrs(sub)))
    for name, p in m.named_parameters():
        items.append((name, tuple(p.shape), str(p.dtype)))
    for name, b in m.named_buffers():
        items.append((name, tuple(b.shape), str(b.dtype)))
    return tuple(items)


def structure_groups(blocks) -> list[int]:
    """Per block: the index of its structural group (numbered in order of first appearance)."""
    groups: dict[tuple, int] = {}
    return [groups.setdefault(structure_key(b), len(groups)) for b in blocks]


def value_sig(value) -> tuple:
    """Hashable pytree structure, shapes and dtypes of ``value`` (non-tensors by repr)."""
    leaves, spec = pytree.tree_flatten(value)
    return (str(spec),) + tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x)
                                for x in leaves)


def call_values(n: fx.Node) -> tuple:
    """The (args, kwargs) a traced call node was called with, as the traced meta values."""
    return (fx.node.map_arg(n.args, lambda x: x.meta.get("val")),
            fx.node.map_arg(n.kwargs, lambda x: x.meta.get("val")))


def _picks_from(n: fx.Node, call: fx.Node) -> bool:
    """``call(...)[i]``: an element picked from a block's tuple output."""
    return (n.op == "call_function" and n.target is operator.getitem and n.args[0] is call
            and isinstance(n.args[1], int))


def assign_rows(top: fx.GraphModule, blocks: list,
                group_of: list[int]) -> tuple[list[RowInfo], dict[str, int]]:
    """The rows (embedding, one per block call, head — or one ``model`` row when no block is
    called) and each top-level node's row: before the first block call is the embedding, after
    the last is the head. Each block row's ``rep`` is its group's first call, the one measured."""
    block_ids = {id(b): i for i, b in enumerate(blocks)}
    block_nodes = [n for n in top.graph.nodes
                   if n.op == "call_module" and id(top.get_submodule(n.target)) in block_ids]
    nblocks = len(block_nodes)
    # a block called more than once (or not at all) gets its row index in its name
    called_once = (nblocks == len(blocks)
                   and len({id(top.get_submodule(x.target)) for x in block_nodes}) == nblocks)
    rows: list[RowInfo] = [RowInfo("embedding", "embedding")]
    for n in block_nodes:
        mod = top.get_submodule(n.target)
        name = module_path(n.target)
        if not called_once:
            name = f"{name}#{len(rows)}"
        # measured once per (structure, input shapes): same code on the same shapes costs the same
        group = (group_of[block_ids[id(mod)]], value_sig(call_values(n)))
        rows.append(RowInfo(name, "block", module=mod, group=group, call_node=n))
    rows.append(RowInfo("head", "head"))
    if not block_nodes:  # no repeated blocks: one row for the whole model
        rows = [RowInfo("model", "other")]

    node_row: dict[str, int] = {}
    current = seen_block = 0
    block_set = set(block_nodes)
    for n in top.graph.nodes:
        if n in block_set:
            seen_block += 1
            current = seen_block
        elif block_nodes and seen_block == nblocks and n.op != "placeholder":
            current = nblocks + 1
            if _picks_from(n, block_nodes[-1]):   # the last block's (hidden, attn probs, ...)
                node_row[n.name] = nblocks        # crosses as the element picked, as between blocks
                continue
        node_row[n.name] = 0 if n.op == "placeholder" else current

    rep_of_group: dict[Any, int] = {}
    for r, info in enumerate(rows):
        if info.kind == "block":
            info.rep = rep_of_group.setdefault(info.group, r)
    return rows, node_row
