"""Subclasses of ``nn.Linear`` that compute a plain linear, kept whole by every tracer.

torch.fx keeps only ``torch.nn``'s own modules whole; a subclass defined elsewhere is traced
through. Falcon's ``FalconLinear`` (``input @ self.weight.T`` then ``+ self.bias``) became two
graph ops on a ``get_attr`` weight, so the trace priced no tensor-parallel pair, the rewrite found
none (under ``tp=2`` the block ran whole on each rank, silently) and, under sequence parallel, the
unsharded attention ran on the rank's sequence chunk against full-length rotary tables. A subclass
is kept whole (a ``call_module`` every pass sees as a linear, and the rewrite replaces by its
column / row shard) when it holds only ``weight`` / ``bias`` and either keeps ``nn.Linear``'s
forward or its forward, traced alone, is exactly ``x @ weight.T`` / ``F.linear(x, weight)`` with
an optional ``+ bias``. Anything else (LoRA adapters, quantised or scaled linears) is traced
through as before.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

_VERDICT: dict[tuple[type, bool], bool] = {}   # (class, has bias) -> plain linear


def is_plain_linear(m: nn.Module) -> bool:
    """``m`` is an ``nn.Linear`` subclass from outside ``torch.nn`` computing a plain linear."""
    if not isinstance(m, nn.Linear) or type(m).__module__.startswith("torch.nn"):
        return False
    if list(m.children()) or {n for n, _ in m.named_parameters()} - {"weight", "bias"} or list(m.buffers()):
        return False
    key = (type(m), m.bias is not None)
    if key not in _VERDICT:
        _VERDICT[key] = type(m).forward is nn.Linear.forward or _forward_is_linear(m)
    return _VERDICT[key]


def _forward_is_linear(m: nn.Linear) -> bool:
    """Whether ``m.forward`` traced alone is ``x @ W.T`` or ``F.linear(x, W[, b])`` (+ ``b``),
    and nothing else."""
    try:
        graph = fx.Tracer().trace(m)
    except Exception:  # noqa: BLE001 - code fx cannot trace is no plain linear
        return False
    ops = {n for n in graph.nodes if n.op not in ("placeholder", "output")}
    weight = next((n for n in ops if n.op == "get_attr" and n.target == "weight"), None)
    bias = next((n for n in ops if n.op == "get_attr" and n.target == "bias"), None)
    x = next(n for n in graph.nodes if n.op == "placeholder")
    core = next(n for n in graph.nodes if n.op == "output").args[0]
    if weight is None or (bias is None) != (m.bias is None) or not isinstance(core, fx.Node):
        return False
    used = {weight} | ({bias} if bias is not None else set())
    added = bias is not None and core.target in (operator.add, torch.add, "add") and bias in core.args
    if added:
        used.add(core)
        core = next(a for a in core.args if a is not bias)
    if not isinstance(core, fx.Node) or core.args[:1] != (x,):
        return False
    used.add(core)
    if core.op == "call_function" and core.target is F.linear:
        b = core.kwargs.get("bias", core.args[2] if len(core.args) > 2 else None)
        ok = core.args[1] is weight and ((b is bias and not added) or (b is None and (added or bias is None)))
    elif core.target in (operator.matmul, torch.matmul, "matmul"):
        t = core.args[1]
        ok = isinstance(t, fx.Node) and t.args[:1] == (weight,) and (
            (t.op == "call_function" and t.target is getattr and t.args[1] in ("T", "mT"))
            or (t.op == "call_method" and t.target == "t")
            or (t.op == "call_method" and t.target == "transpose" and set(t.args[1:]) in ({0, 1}, {-1, -2})))
        ok = ok and (added or bias is None)
        used.add(t)
    else:
        return False
    return ok and ops == used
