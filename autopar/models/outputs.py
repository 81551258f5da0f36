"""What a model's forward returns, and how it is called with targets: one convention for the
trace, the runtime's row cut and the serial reference.

Models people train return more than a tensor: nanoGPT and minGPT return ``(logits, loss)``,
transformers a ``ModelOutput``, others a dict. The loss path always reads the *logits*
(:func:`model_logits`): the first tensor of a tuple, ``logits`` (else ``last_hidden_state``) of
a mapping. A model whose ``forward`` takes ``targets`` (nanoGPT, minGPT) computes full-sequence
logits only when it is given targets (``targets=None`` makes nanoGPT return the last position
only), so the trace, the row cut and the serial run all call it with targets
(:func:`forward_kwargs`) and take its logits: the computation measured is the one trained.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch
import torch.nn as nn

TARGET_NAMES = ("targets",)


def targets_keyword(model: nn.Module) -> str | None:
    """The name of ``model.forward``'s targets argument (``targets``), or None."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n in TARGET_NAMES if n in params), None)


def forward_kwargs(model: nn.Module, inputs: tuple, targets=None) -> dict:
    """Keyword arguments that make ``model`` compute full-sequence logits: its targets argument,
    given the real targets, or (tracing, cutting) zeros shaped like the first input."""
    name = targets_keyword(model)
    if name is None:
        return {}
    if targets is None:
        first = inputs[0]
        targets = torch.zeros(first.shape, dtype=torch.long, device=first.device)
    return {name: targets}


def model_logits(output):
    """The logits in whatever ``output`` a forward returned (see the module docstring)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        for key in ("logits", "last_hidden_state"):
            value = output.get(key) if hasattr(output, "get") else None
            if value is not None:
                return value
        values = [v for v in output.values() if v is not None]
        return values[0] if values else None
    if isinstance(output, (tuple, list)):
        for value in output:
            if value is not None:
                return value
    return output


def serial_forward(model: nn.Module, inputs: tuple, targets=None):
    """The logits of ``model`` on ``inputs`` called as the trace and the runtime call it."""
    return model_logits(model(*inputs, **forward_kwargs(model, inputs, targets)))
