"""Models whose forward depends on the statistics of the batch it sees (BatchNorm in training
mode): which plans still train the serial model, and which do not.

Data parallelism keeps them equal to serial: the runtime normalises over the whole dp group
(``autopar.runtime.step.sync_batch_norm``). Micro-batching does not: a pipeline or gradient
accumulation normalises each micro-batch with its own statistics, which no all-reduce can
share before the micro-batch's forward has run — a ResNet so trained is a different model
(its loss 4.5 % off ResNet-18's serial one at pp = 2, 31 % off ResNet-50's). Such a plan is
refused before launch in one line, unless the user says it is what they want
(``--allow-batch-statistics`` / ``allow_batch_statistics=True``: each micro-batch normalised
alone, as torch's own pipelining and DDP with accumulation do).
"""
from __future__ import annotations

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from costmodels.contracts.errors import PlanError


def batch_norms(model: nn.Module) -> list[str]:
    """Names of the modules that normalise with batch statistics when training."""
    return [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]


def check_batch_statistics(model: nn.Module, plan, num_micro_batches: int | None,
                           allow: bool = False) -> None:
    """Refuse (one line) a plan whose micro-batches would each normalise alone."""
    if allow or not model.training:
        return
    norms = batch_norms(model)
    if not norms:
        return
    split = f"pipeline stages (pp={plan.pp})" if plan.pp > 1 else None
    if split is None and num_micro_batches is not None and num_micro_batches > 1:
        split = f"{num_micro_batches} micro-batches per step (gradient accumulation)"
    if split is None:
        return
    raise PlanError(f"{type(model).__name__} has BatchNorm ({norms[0]}, {len(norms)} in all), which "
                    f"normalises each micro-batch with its own statistics: under {split} it trains a "
                    "different model than serial; use one micro-batch per dp rank and pp=1 (dp keeps "
                    "BatchNorm synchronised), or pass --allow-batch-statistics to accept it")
