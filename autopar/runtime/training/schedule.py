"""AdamW with linear warm-up and cosine decay (nanoGPT's ``get_lr``, torchtitan's
``lr_scheduler.warmup_steps`` + cosine): the learning rate rises linearly over ``warmup`` steps
to ``lr``, then falls along a half cosine to ``min_lr_ratio · lr`` at ``steps``."""
from __future__ import annotations

import math

import torch


def lr_factor(step: int, warmup: int, steps: int, min_ratio: float = 0.1) -> float:
    """The multiplier of the base learning rate for optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if steps <= warmup:
        return 1.0
    done = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * done))


def make_optimizer(params, lr: float, warmup: int, steps: int, weight_decay: float = 0.1,
                   betas=(0.9, 0.95)):
    """(AdamW, LambdaLR): the scheduler's state goes into the checkpoint's ``extra``."""
    params = list(params)
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay,
                            **({"fused": True} if fused else {}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, steps))
    return opt, sched
