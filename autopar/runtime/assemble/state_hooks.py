"""The serial model's state-dict hooks, kept for ``Runner.full_state_dict``.

A model may show its checkpoint in another layout than its parameters: torchtitan-style code
fuses q, k and v into one ``wqkv`` weight and registers a state-dict hook that splits it into
``wq`` / ``wk`` / ``wv`` (and a load pre-hook that fuses them back). The hooked keys are new
tensors, not the parameters, so matching local parameters to hooked keys dropped ``wqkv``
silently. The runtime therefore maps parameters to the model's *raw* keys
(:func:`raw_state_dict`, hooks off), gathers that raw state dict, and then runs the serial
model's own hooks on it (:func:`apply_hooks`, children before parents, as ``state_dict`` does):
the result has the serial ``state_dict()``'s keys and loads strictly into the serial model.
"""
from __future__ import annotations

import contextlib

import torch.nn as nn


@contextlib.contextmanager
def hooks_off(model: nn.Module):
    """Every module's state-dict hooks removed for the duration (restored after)."""
    saved = []
    for m in model.modules():
        saved.append((m, m._state_dict_hooks, m._state_dict_pre_hooks))
        m._state_dict_hooks, m._state_dict_pre_hooks = type(m._state_dict_hooks)(), type(m._state_dict_pre_hooks)()
    try:
        yield
    finally:
        for m, post, pre in saved:
            m._state_dict_hooks, m._state_dict_pre_hooks = post, pre


def raw_state_dict(model: nn.Module, keep_vars: bool = True) -> dict:
    """``model.state_dict()`` as its parameters and buffers are named (no hooks run)."""
    with hooks_off(model):
        return model.state_dict(keep_vars=keep_vars)


def capture(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(prefix, a ``meta`` copy of the module) for each module with state-dict hooks, children
    before parents: what :func:`apply_hooks` needs once the model itself is gone."""
    from autopar.trace.cut import meta_copy
    found = [(name, m) for name, m in model.named_modules() if m._state_dict_hooks]
    found.sort(key=lambda nm: -(nm[0].count(".") + 1) if nm[0] else 0)
    return [(f"{name}." if name else "", meta_copy(m)) for name, m in found]


def apply_hooks(hooked: list[tuple[str, nn.Module]], state: dict) -> dict:
    """``state`` (raw keys) as the serial model's ``state_dict()`` would show it."""
    for prefix, module in hooked:
        for hook in list(module._state_dict_hooks.values()):
            out = hook(module, state, prefix, {})
            if out is not None:
                state = out
    return state
