"""One training step's forward and backward: micro-batches run locally (pp=1, gradient sync
only on the last) or through a ``torch.distributed.pipelining`` schedule (pp>1).

Kept apart from the Runner, which decides *what* runs on this rank; this module is *how* a step
runs it, and what a schedule refuses is turned into a PlanError naming the fix here.
"""
from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

from costmodels.contracts.errors import AutoparError, PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.runnable import check_schedule


def run_local(module, inputs: tuple, targets, n_micro: int, micro_batch_size: int,
              loss_fn: Callable, keep_unsharded: bool = False) -> torch.Tensor:
    """Forward and backward of ``n_micro`` micro-batches through one (DDP / FSDP / plain)
    module, gradients synced only on the last; returns the mean micro-batch loss as a 0-d tensor
    on the module's device (summed there: reading it per micro-batch would stop the host until
    the device caught up, issue 29).
    ``keep_unsharded`` (ZeRO-2 on FSDP2): parameters stay gathered from the first micro-batch's
    forward to the last one's backward — one all-gather per step, as ZeRO-2 means, instead of
    FSDP2's default of one per micro-batch."""
    fsdp = is_fsdp(module)
    total = None
    for i in range(n_micro):
        last = i == n_micro - 1
        fresh_autocast_casts()
        sl = slice(i * micro_batch_size, (i + 1) * micro_batch_size)
        if fsdp:
            module.set_requires_gradient_sync(last)
            if keep_unsharded:
                module.set_reshard_after_backward(last)
            ctx = contextlib.nullcontext()
        elif hasattr(module, "no_sync") and not last:
            ctx = module.no_sync()
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            out = module(*(t[sl] for t in inputs))
            loss = call_loss(loss_fn, out, targets[sl] if targets is not None else None)
            (loss / n_micro).backward()
        loss = loss.detach().float()
        total = loss if total is None else total + loss
    return total / n_micro


def fresh_autocast_casts() -> None:
    """Drop autocast's cached weight casts before a micro-batch's forward.

    A step runs inside one ``torch.autocast`` region (``autopar train``, ``autopar validate``),
    whose cache would hand micro-batches 2…m the casts micro-batch 1 made. Their autograd nodes
    are then older than every node of the later graphs, and the engine runs them last (highest
    sequence number first: torch/csrc/autograd/engine.h): FSDP2's post-backward reduce-scatters
    a module's gradients before those casts have accumulated them — wrong gradients at ZeRO-2/3
    (benchmarks/probe_fsdp2_autocast_grads.py measured 0.604 relative error) — and every bf16
    weight gradient waits to the end of the backward (tests/test_memory_autocast_grads.py).
    Casting anew per micro-batch is what a region per micro-batch does; outside autocast the
    cache is empty and this costs nothing."""
    torch.clear_autocast_cache()


def run_pipeline(schedule, inputs: tuple, targets, first_stage: bool, last_stage: bool,
                 device: torch.device | None = None) -> torch.Tensor:
    """One step of a pipelining schedule; returns the mean micro-batch loss on the rank holding
    the last stage, 0 elsewhere, as a 0-d tensor on ``device`` (the losses are summed on the
    device: no host sync)."""
    args, kwargs, losses = (), {}, []
    if first_stage:
        args = inputs
    if last_stage:
        schedule.autopar_loss.targets_given = targets is not None
        if targets is None:   # torch's schedules need a target per micro-batch; the loss gets None
            targets = torch.zeros(inputs[0].size(0), device=inputs[0].device)
        kwargs = dict(target=targets, losses=losses)
    schedule.step(*args, return_outputs=False, **kwargs)   # the last stage keeps no outputs (losses only)
    if not losses:
        return torch.zeros((), device=device if device is not None else inputs[0].device)
    unscale = schedule.autopar_loss.n_micro   # each loss was divided by it before backward
    return torch.stack([x.detach().float() for x in losses]).sum() * (unscale / len(losses))


def make_schedule(plan: Plan, pipe_stages: list, n_micro: int, loss_fn: Callable):
    """The plan's pipeline schedule over this rank's PipelineStages for ``n_micro`` micro-batches.

    Each micro-batch's loss is divided by ``n_micro`` before its backward (Megatron's way) and
    torch's per-stage ``scale_grads`` is off: torch divides each local stage's gradients after
    the step, which divides a Parameter that two local stages share (a tied embedding and LM
    head, both on rank 0 of a V schedule) twice. The losses are reported unscaled."""
    from torch.distributed import pipelining as pl
    check_schedule(plan, n_micro)   # the rule's owner: costmodels.contracts.runnable
    for stage in pipe_stages:   # each micro-batch's forward casts its weights anew (fresh_autocast_casts)
        if not getattr(stage.submod, "_autopar_fresh_casts", False):
            stage.submod.register_forward_pre_hook(lambda *_: fresh_autocast_casts())
            stage.submod._autopar_fresh_casts = True
    loss = PipelineLoss(loss_fn, n_micro)
    try:
        if plan.schedule in _MULTI_STAGE:
            schedule = getattr(pl, _MULTI_STAGE[plan.schedule])(
                pipe_stages, n_micro, loss_fn=loss, scale_grads=False)
        else:
            cls = pl.ScheduleGPipe if plan.schedule == "gpipe" else pl.Schedule1F1B
            schedule = cls(pipe_stages[0], n_micro, loss_fn=loss, scale_grads=False)
        schedule.autopar_loss = loss
        return schedule
    except ValueError as e:
        raise PlanError(f"schedule '{plan.schedule}' with pp={plan.pp} cannot run "
                        f"{n_micro} micro-batch(es) per step ({e}); raise the global "
                        "batch or lower 'micro_batch_size'") from None


# torch's class for each schedule that runs several stages per rank (the plan's name -> class)
_MULTI_STAGE = {"interleaved-1f1b": "ScheduleInterleaved1F1B",
                "interleaved-zb": "ScheduleInterleavedZeroBubble",
                "zb-v": "ScheduleZBVZeroBubble", "dualpipe-v": "ScheduleDualPipeV"}


class PipelineLoss:
    """The user's ``loss_fn(output, targets)`` as torch's schedules call it: they require a
    target on the last stage, so a step without targets hands them placeholder zeros and the
    user's function gets ``targets=None``, as it does with pp=1."""

    def __init__(self, loss_fn: Callable, n_micro: int = 1):
        self.loss_fn = loss_fn
        self.targets_given = True
        self.n_micro = n_micro    # each micro-batch's loss is divided by it (make_schedule)

    def __call__(self, output, target):
        loss = call_loss(self.loss_fn, output, target if self.targets_given else None)
        return loss / self.n_micro if self.n_micro > 1 else loss


def call_loss(loss_fn: Callable, output, targets):
    """``loss_fn(output, targets)``, checked: an exception inside it, or a result that is not a
    scalar tensor, is one PlanError line naming the function, its file and line — on the rank
    that computes the loss; the others then report that rank as lost."""
    name = getattr(loss_fn, "__qualname__", type(loss_fn).__name__)
    try:
        loss = loss_fn(output, targets)
    except AutoparError:
        raise
    except Exception as e:  # noqa: BLE001 — the user's loss: one line naming where
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not any(d in f.filename for d in _LIBRARY_DIRS)]
        at = ""
        if frames:
            code = (frames[-1].line or "").strip()
            at = f" at {frames[-1].filename}:{frames[-1].lineno}" + (f" `{code}`" if code else "")
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise PlanError(f"loss_fn {name} raised {type(e).__name__}: {msg}{at}; it is called as "
                        "loss_fn(model output, targets of the micro-batch) (targets None when "
                        "train_step got none)") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise PlanError(f"loss_fn {name} returned {what}; it must return a scalar tensor (the mean "
                        "loss of its micro-batch)")
    return loss


_LIBRARY_DIRS = (os.path.dirname(torch.__file__),
                 os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def all_reduce_tied(stages: list, tied: list[tuple[int, str, object]]) -> None:
    """Sum the gradients of parameters tied across pipeline ranks (``tied``: (stage index,
    parameter name, group of the ranks using it))."""
    for s, name, g in tied:
        grad = stages[s].get_parameter(name).grad
        if grad is not None:
            dist.all_reduce(_local(grad), group=g)


def is_fsdp(module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(module, FSDPModule)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a plain tensor as is)."""
    return t.to_local() if hasattr(t, "to_local") else t
