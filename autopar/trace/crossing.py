"""What of a value crosses a row cut: the elements of a tuple that a later row reads.

Shared by the cut (``autopar.trace.cut``: what a row returns and the next receives) and the layer
table (``autopar.trace.table``: the bytes each boundary carries), so the cost model prices what
the runtime sends.
"""
from __future__ import annotations

import operator

import torch.fx as fx


def dead_elements(n: fx.Node, later: list) -> frozenset:
    """Indices of tuple ``n``'s elements that none of the ``later`` users reads."""
    if not isinstance(n.meta.get("val"), (tuple, list)) or not later or \
            not all(u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)
                    for u in later):
        return frozenset()
    return frozenset(range(len(n.meta["val"]))) - {u.args[1] % len(n.meta["val"]) for u in later}
