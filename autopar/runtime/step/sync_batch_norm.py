"""BatchNorm over the data-parallel group: what ``nn.SyncBatchNorm`` does, on any device.

A BatchNorm in training mode normalises with the statistics of the batch it sees. Under dp each
rank sees 1/dp of the batch, so each normalises differently from the serial model (ResNet-18's
loss 4.5 % off at dp = 2, ResNet-50's 31 %). Users convert to ``nn.SyncBatchNorm``; torch's
refuses CPU tensors, so autopar swaps the class of each BatchNorm of a rank's stages for a
subclass (``synced``) whose training forward all-reduces the per-channel sum and the sum of
squared deviations over the dp group (``torch.distributed.nn.functional.all_reduce``:
differentiable, its backward sums the gradients, which is the serial model's gradient through
the shared statistics). Parameters and buffers stay the same objects under the same names, so
state dicts and checkpoints do not change; running statistics are updated as serial's are
(unbiased variance over the whole batch). The all-reduce is an autograd function (``_AllReduce``):
a sum forward, a sum of the gradients backward.

Only the statistics of one micro-batch can be shared this way: micro-batching (pipeline,
gradient accumulation) still normalises each micro-batch alone — ``autopar.runtime.assemble.
batch_statistics`` refuses that before launch unless the user allows it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

_SYNCED: dict[type, type] = {}


def synced(module: nn.Module, group) -> int:
    """Make every BatchNorm under ``module`` normalise over ``group``; returns how many."""
    n = 0
    for m in module.modules():
        if isinstance(m, _BatchNorm) and not isinstance(m, _SyncedBatchNorm):
            cls = type(m)
            if cls not in _SYNCED:
                _SYNCED[cls] = type(f"Synced{cls.__name__}", (_SyncedBatchNorm, cls), {})
            m.__class__ = _SYNCED[cls]
            m.autopar_group = group
            n += 1
    return n


class _SyncedBatchNorm(_BatchNorm):
    autopar_group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.autopar_group is None or not dist.is_initialized():
            return super().forward(x)
        self._check_input_dim(x)
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        local = torch.tensor([x.numel() // x.size(1)], dtype=x.dtype, device=x.device)
        sums = _AllReduce.apply(torch.cat([x.sum(dims), local]), self.autopar_group)
        count = float(sums[-1].detach())
        mean = sums[:-1] / count
        centred = x - mean.view(shape)
        var = _AllReduce.apply(centred.pow(2).sum(dims), self.autopar_group) / count
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running(mean.detach(), var.detach(), count)
        return y

    @torch.no_grad()
    def _update_running(self, mean, var, count: float) -> None:
        self.num_batches_tracked.add_(1)
        momentum = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
        unbiased = var * (count / max(count - 1.0, 1.0))
        self.running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
        self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)


class _AllReduce(torch.autograd.Function):
    """Sum over ``group``; the gradient of every rank's input is the sum of all ranks' output
    gradients (each rank's loss depends on every rank's statistics)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
