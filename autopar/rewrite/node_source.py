"""Where a graph node came from in the user's code, for one-line errors.

Its own module (not ``fx_util``) because the routed-experts leaf (``experts.py``), which
``fx_util``'s tracer uses, names nodes in its errors too: one owner below both keeps the
package free of import cycles.
"""
from __future__ import annotations

import os

import torch
import torch.fx as fx


def where(node: fx.Node) -> str:
    """' at FILE:LINE: code' of the user's line that made ``node`` (or its name)."""
    st = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in st.strip().splitlines() if ln.strip()]
    frames = [(a, b) for a, b in zip(lines, lines[1:]) if a.startswith("File ")]
    own = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    user = [f for f in frames if not any(d in f[0] for d in own)]
    if user:
        return f" at {user[-1][0]}: {user[-1][1]}"
    if len(lines) >= 2:
        return f" at {lines[-2]}: {lines[-1]}"
    return f" (node {node.name})"
