"""Tracing a model with BatchNorm: the trace runs the forward once on real values (the row
cutter, ``autopar.trace.cut``) and must neither move the running statistics nor fail on a batch
whose statistics are undefined in training mode (a micro-batch of one sample reaching a 1×1
feature map: torchvision ResNet's 'Expected more than 1 value per channel when training')."""
from __future__ import annotations

import contextlib

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm


@contextlib.contextmanager
def frozen_batch_statistics(model: nn.Module):
    """BatchNorm in eval mode while a trace runs the model once: the trace must not move the
    running statistics, and a batch of one (or a 1×1 feature map) has no variance to normalise
    with in training mode (torchvision's ResNet: 'Expected more than 1 value per channel').
    The graph calls the modules themselves, so their mode at run time is the user's."""
    flipped = eval_batch_norms(model)
    try:
        yield
    finally:
        for m in flipped:
            m.training = True


def eval_batch_norms(model: nn.Module) -> list[nn.Module]:
    """Put the BatchNorms of ``model`` that are training in eval mode; returns them."""
    flipped = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.training]
    for m in flipped:
        m.training = False
    return flipped
