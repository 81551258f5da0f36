"""What an fx node is, and which nodes reach which: shared by the trace and the rewrite.

The trace (which prices tensor-parallel pairs and the attention core for the cost model) and the
rewrite (which shards and checkpoints them) must recognise the same linears, softmaxes and
activation matmuls and walk the graph the same way, or the plan would be priced on one graph
and run on another. So both import these predicates and the one walker below.

``walk`` is the single graph traversal: depth-first from some nodes along a ``step``
(``INPUTS`` = towards producers, ``USERS`` = towards consumers), where an optional ``visit``
decides per node whether to go on through it (``EXPAND``), keep it but not go past it
(``PRUNE``), or give up the whole walk (``ABORT``). ``nearest`` is its breadth-first sibling
for "the closest node that satisfies a predicate".
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

_MATMUL_FUNCS = {operator.matmul, torch.matmul, torch.bmm, torch.einsum}
_MATMUL_METHODS = {"matmul", "bmm", "__matmul__"}
_SOFTMAX_FUNCS = {F.softmax, torch.softmax, torch.nn.functional.softmax, F.log_softmax}
_SOFTMAX_METHODS = {"softmax"}

EXPAND, PRUNE, ABORT = "expand", "prune", "abort"
Step = Callable[[fx.Node], Iterable[fx.Node]]


def INPUTS(n: fx.Node) -> list[fx.Node]:
    """Towards the producers of ``n``'s arguments."""
    return n.all_input_nodes


def USERS(n: fx.Node) -> list[fx.Node]:
    """Towards the consumers of ``n``'s value."""
    return list(n.users)


def walk(starts: Iterable[fx.Node], step: Step,
         visit: Callable[[fx.Node], str] | None = None) -> tuple[list[fx.Node], bool]:
    """(every node reached from ``starts`` along ``step``, the starts included, in visit order;
    whether the walk completed). ``visit(node)`` returns EXPAND (go on through it, the default),
    PRUNE (keep it, go no further from it) or ABORT (stop: the walk did not complete)."""
    seen: set = set()
    order: list[fx.Node] = []
    stack = list(starts)
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        order.append(u)
        action = visit(u) if visit is not None else EXPAND
        if action == ABORT:
            return order, False
        if action == EXPAND:
            stack.extend(step(u))
    return order, True


def ancestors(n: fx.Node) -> set:
    """Every node ``n`` depends on (not ``n`` itself)."""
    return set(walk(n.all_input_nodes, INPUTS)[0])


def descendants(nodes: Iterable[fx.Node]) -> set:
    """Every node that depends on one of ``nodes`` (not the nodes themselves, unless one depends
    on another)."""
    return set(walk([u for n in nodes for u in n.users], USERS)[0])


def reaches(a: fx.Node, b: fx.Node) -> bool:
    """Whether data flows from ``a`` to ``b``."""
    return not walk([a], USERS, lambda x: ABORT if x is b else EXPAND)[1]


def nearest(start: fx.Node, step: Step, pred: Callable[[fx.Node], bool],
            limit: int | None = None) -> fx.Node | None:
    """The first node (breadth-first along ``step``, ``start`` excluded, at most ``limit`` levels
    away) that satisfies ``pred``, or None."""
    frontier, seen, level = list(step(start)), set(), 0
    while frontier and (limit is None or level < limit):
        nxt = []
        for x in frontier:
            if x in seen:
                continue
            seen.add(x)
            if pred(x):
                return x
            nxt.extend(step(x))
        frontier, level = nxt, level + 1
    return None


def is_linear_module(m: nn.Module) -> bool:
    """nn.Linear, or transformers' Conv1D (GPT-2's linear with a transposed weight)."""
    return isinstance(m, nn.Linear) or (type(m).__name__ == "Conv1D" and hasattr(m, "nf"))


def is_softmax(gm: fx.GraphModule, n: fx.Node) -> bool:
    """A softmax (function, method or module; log-softmax too)."""
    if n.op == "call_function" and n.target in _SOFTMAX_FUNCS:
        return True
    if n.op == "call_method" and n.target in _SOFTMAX_METHODS:
        return True
    if n.op == "call_module":
        try:
            return isinstance(gm.get_submodule(n.target), (nn.Softmax, nn.LogSoftmax))
        except AttributeError:
            return False
    return False


def is_activation_matmul(n: fx.Node) -> bool:
    """A matmul between two activations (no parameter operand): attention's scores and A·V."""
    if not ((n.op == "call_function" and n.target in _MATMUL_FUNCS)
            or (n.op == "call_method" and n.target in _MATMUL_METHODS)):
        return False
    ins = [a for a in n.all_input_nodes]
    return len(ins) >= 2 and not any(a.op == "get_attr" for a in ins)


_FUSED_ATTENTION = {F.scaled_dot_product_attention}


def is_fused_attention(n: fx.Node) -> bool:
    """``F.scaled_dot_product_attention(q, k, v)``: heads are dim -3 of q (kv heads of k)."""
    return n.op == "call_function" and n.target in _FUSED_ATTENTION
