"""Buffers a model computes in its constructor (transformers' rotary ``inv_freq``), for a model
built on ``meta`` and materialised row by row.

A cut row (``autopar.trace.cut``) reads such a buffer by its path, without the module that owns
it, so running the model's ``_init_weights`` over the row's modules never reaches the owner
(``LlamaRotaryEmbedding``) and the buffer would keep uninitialised memory (a NaN loss, silently).
The same holds for a parameter read by path (a final norm traced through into the head row).
Here each such tensor the row materialised from ``meta`` is given to its owner in the user's
model for the duration of one ``_init_weights(owner)`` call — transformers recomputes rotary
tables and sets norms to ones there — so the row holds the values a model built for real
would have.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def module_init(model: nn.Module | None):
    """The model's per-module initialiser (transformers' ``_init_weights``), or None."""
    for m in (model, getattr(model, "model", None)):
        if m is not None and callable(getattr(m, "_init_weights", None)) and hasattr(m, "config"):
            return m._init_weights
    return None


def refill_computed_buffers(model: nn.Module | None, row: nn.Module, meta_names: set[str]) -> None:
    """Run ``_init_weights`` once on each owner, in ``model``, of the tensors of ``row`` named in
    ``meta_names`` that the row reads without holding the owner (a buffer or a parameter read by
    path: rotary ``inv_freq``, a final norm's weight traced through), with the row's tensors
    swapped in for the call."""
    init = module_init(model)
    if init is None or not meta_names:
        return
    inside = {id(m) for m in row.modules()}
    tensors = dict(row.named_buffers(remove_duplicate=False)) | dict(row.named_parameters(remove_duplicate=False))
    owners: dict[int, tuple[nn.Module, list]] = {}
    for name in sorted(meta_names):
        owner_path, _, leaf = name.removeprefix("inner.").rpartition(".")
        try:
            owner = model.get_submodule(owner_path) if owner_path else model
        except AttributeError:
            continue
        store = owner._parameters if leaf in owner._parameters else owner._buffers
        if id(owner) in inside or leaf not in store or name not in tensors:
            continue
        owners.setdefault(id(owner), (owner, []))[1].append((store, leaf, tensors[name]))
    for owner, swaps in owners.values():
        saved = [(store, leaf, store[leaf]) for store, leaf, _ in swaps]
        for store, leaf, t in swaps:
            store[leaf] = t
        try:
            with torch.no_grad():
                init(owner)
        finally:
            for store, leaf, t in saved:
                store[leaf] = t
