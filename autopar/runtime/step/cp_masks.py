"""Attention masks among a model's inputs under context parallelism: refused unless they mask nothing.

Under ``cp`` every attention a row runs becomes ``ContextParallelAttention`` (``autopar.rewrite.
context_parallel``): the local queries against all keys of the sequence, causal by global
position. A mask the model reads from its inputs is *not* passed to it — the rewrite cannot tell a
padding mask from the causal one a transformers model builds from it, and slicing a ``(B, S)``
mask with the sequence would still leave the attention blind to it. So a padding mask (a
``(B, S)`` mask with a zero) or a full mask that is not causal (``(…, S, S)``) would be dropped
silently and the losses would differ from the serial model's. Each step's inputs (and the
example inputs, before launch) are checked here and such a mask is refused in one line naming
the model and the input; an all-ones padding mask or a causal full mask is harmless and runs.

Which input is a mask: one whose ``forward`` parameter is named ``*mask*``, or any ``bool``
tensor; the first input (the tokens) never is.
"""
from __future__ import annotations

import inspect

import torch

from costmodels.contracts.errors import PlanError


def input_names(model) -> tuple[str, ...] | None:
    """The names of ``model.forward``'s positional parameters (the inputs a step passes in
    order), or None where its signature cannot be read."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    return tuple(p.name for p in params
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def check_cp_masks(inputs: tuple, seq: int, cp: int, names=None, model: str = "the model") -> None:
    """Raise the one-line PlanError for a mask among ``inputs[1:]`` that masks a token (a
    padding mask) or is not causal (module docstring); ``seq``: tokens per sample."""
    for i, t in enumerate(inputs):
        name = names[i] if names is not None and i < len(names) else None
        if i == 0 or not isinstance(t, torch.Tensor) or t.is_meta:
            continue
        if not ((name is not None and "mask" in name.lower()) or t.dtype == torch.bool):
            continue
        label = f"input {i}" + (f" ('{name}')" if name else "")
        full = t.dim() >= 3 or (t.dim() == 2 and t.size(0) == seq and t.size(0) != inputs[0].size(0))
        if t.dim() == 2 and t.size(1) == seq and not full:
            masked = int((t == 0).sum()) if t.dtype != torch.bool else int((~t).sum())
            if masked:
                raise PlanError(f"context parallel (cp={cp}): {label} of {model} is a padding mask "
                                f"hiding {masked} of its {t.numel()} tokens, which the cp attention "
                                "(causal over the whole sequence) cannot apply; pack the samples without "
                                "padding (an all-ones mask) or use cp=1")
        elif full and t.size(-1) == seq and t.size(-2) == seq and not _is_causal(t):
            raise PlanError(f"context parallel (cp={cp}): {label} of {model} is an attention mask "
                            f"over {seq}×{seq} positions that is not causal; only causal attention "
                            "runs under cp (the mask is not sliced with the sequence); use cp=1")


def _is_causal(mask: torch.Tensor) -> bool:
    """A boolean mask that is True exactly on and below the diagonal, or an additive one that is
    0 there and at most -1e4 (or -inf) above it."""
    s = mask.size(-1)
    lower = torch.tril(torch.ones(s, s, dtype=torch.bool, device=mask.device))
    if mask.dtype == torch.bool:
        return bool((mask == lower).all())
    if mask.is_floating_point():
        return bool((mask[..., lower] == 0).all() and (mask[..., ~lower] <= -1e4).all())
    return bool(((mask != 0) == lower).all())
