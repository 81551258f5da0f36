"""``autopar.train.train(TrainConfig(...))``: the training loop behind ``autopar train``.

One optimizer step per global batch: this dp rank's share read from the data at the step's
position (``autopar.runtime.training.data``), ``runner.train_step(..., sync=False)`` (the loss stays on the
device), clipping by the serial model's norm (``runner.clip_grad_norm_``), AdamW and the warm-up
+ cosine schedule (``autopar.runtime.training.schedule``). The host waits for the device only on the steps
it logs (every ``log_every``: one ``float`` of the loss, on the first rank of the plan), so the
measured time of a logged step is the mean over the steps since the last log.

Checkpoints go through ``runner.save`` / ``runner.load`` (any plan resumes any other: the
checkpoint reshards); ``extra`` holds what the runner does not know: the data position (samples
consumed), the global batch and the scheduler's state (the optimizer's state is the runner's).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from costmodels.contracts.errors import PlanError


@dataclass
class TrainConfig:
    """What ``autopar train`` takes (its flags, same names)."""

    model: str
    plan: str
    global_batch: int | None = None
    data: str = "random"
    steps: int = 100
    index: int = 1                 # 1-based, as the plans tables number them
    seq: int | None = None
    lr: float = 3e-4
    warmup: int = 0
    clip: float | None = 1.0
    weight_decay: float = 0.1
    save: str | None = None        # '{step}' in it: one checkpoint per save
    save_every: int = 0
    resume: str | None = None
    log_every: int = 1
    hardware: str | None = None
    compile: bool | None = None    # None: on CUDA yes, on CPU no (the default)
    seed: int = 0
    data_dtype: str | None = None


@dataclass
class TrainResult:
    """What a run did, on this rank: the logged steps' losses (first rank of the plan; empty on
    the others), where it started and ended, and the checkpoints it wrote."""

    losses: dict[int, float] = field(default_factory=dict)
    start_step: int = 0
    end_step: int = 0
    data_position: int = 0
    saved: list[str] = field(default_factory=list)


def choose_plan(cfg: TrainConfig):
    """(plan, seq, global batch) from ``--plan`` (JSON, a plan file or a plans file: its
    ``--index``-th plan, counted from 1) with the plans file's seq and global batch as defaults."""
    from costmodels.contracts.plans_file import PlansFile
    given = PlansFile.read(cfg.plan)
    n = len(given.plans)
    if not 1 <= cfg.index <= n:
        raise PlanError(f"--index {cfg.index}: the plan file holds {n} plan(s), numbered 1..{n} "
                        "as 'autopar search' prints them")
    seq = cfg.seq if cfg.seq is not None else (given.seq if given.model == cfg.model else None)
    return given.plans[cfg.index - 1], seq, cfg.global_batch or given.global_batch


def train(cfg: TrainConfig, print_fn=print) -> TrainResult:
    """Run ``cfg`` on this rank (under torchrun, every rank calls it); see the module docstring."""
    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults.failures import alike_on_every_rank, install_error_hook
    from autopar.runtime.step import gpu_defaults
    from autopar.runtime.training.data import local_batch, open_data
    from autopar.runtime.training.metrics import log_line, peak_memory_bytes, yardstick
    from autopar.runtime.training.schedule import make_optimizer

    install_error_hook()   # a script calling train() under a launcher: one line on one rank
    cuda = torch.cuda.is_available()
    if cuda:
        gpu_defaults.set_env()   # before the first CUDA allocation and the NCCL group
    with alike_on_every_rank():   # the same on every rank: under a launcher rank 0 says it
        check_config(cfg)
        plan, seq, global_batch = choose_plan(cfg)
        source = load_model(cfg.model, seq=seq)
        data = open_data(cfg.data, source, cfg.data_dtype, cfg.seed)
    compiled = cuda if cfg.compile is None else cfg.compile
    model = source.build_meta(attention=plan.attention)   # each rank materialises its rows only
    runner = apply(model, plan, loss_fn=source.loss, spec=cfg.model, seq=seq, seed=cfg.seed,
                   global_batch=global_batch, compile=compiled)
    opt, sched = make_optimizer(runner.parameters(), cfg.lr, cfg.warmup, cfg.steps, cfg.weight_decay)
    result, position = TrainResult(), 0
    if cfg.resume:
        extra = runner.load(cfg.resume, optimizer=opt) or {}   # resharded from its plan
        if "data_position" not in extra:
            raise PlanError(f"--resume {cfg.resume}: the checkpoint has no data position (not "
                            "written by autopar train); resume it with the script that saved it")
        position = int(extra["data_position"])
        sched.load_state_dict(extra["scheduler"])
        global_batch = global_batch if cfg.global_batch else int(extra["global_batch"])
    if global_batch is None:
        raise PlanError("--global-batch is missing (sequences per optimizer step over all dp "
                        "ranks; a plans file from 'autopar search' carries its own)")
    plan.num_micro_batches(global_batch)   # one line when dp·micro_batch_size does not divide it
    lead = runner.rank == runner.layout.ranks[0]
    start = result.start_step = runner.step
    if start >= cfg.steps:
        raise PlanError(f"--steps {cfg.steps}: the checkpoint is already at step {start}; ask for "
                        "more steps")
    tokens_per_step = global_batch * source.seq
    ys = yardstick(cfg.model, seq, plan, global_batch, cfg.hardware, cuda, compiled) if lead else None
    if lead:
        print_fn(f"autopar train: model {cfg.model}, plan {plan.label()}, global batch "
                 f"{global_batch} ({tokens_per_step:,} tokens), steps {start + 1}..{cfg.steps}, "
                 f"data {cfg.data} from sample {position}"
                 f"{', compiled' if compiled else ''}"
                 f"{f', resumed from {cfg.resume}' if cfg.resume else ''}"
                 f"{f' ({ys.note})' if ys.note else ''}")
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda
                else contextlib.nullcontext())

    def save():
        path = cfg.save.replace("{step}", str(runner.step))
        runner.save(path, optimizer=opt, extra={"data_position": position, "global_batch": global_batch,
                                                "scheduler": sched.state_dict(), "data": cfg.data})
        result.saved.append(path)
        if lead:
            print_fn(f"saved step {runner.step} (data position {position}) to {path}")

    t_last, step_last = time.perf_counter(), start
    for step in range(start + 1, cfg.steps + 1):
        inputs, targets = local_batch(data, position, global_batch, runner.dp_rank, runner.dp_size)
        if cuda:   # pinned and non-blocking: a pageable copy would wait for the previous step
            inputs = tuple(t.pin_memory().to(runner.device, non_blocking=True) for t in inputs)
            targets = None if targets is None else targets.pin_memory().to(runner.device, non_blocking=True)
        with autocast:
            loss = runner.train_step(inputs, targets, sync=False)
        norm = runner.clip_grad_norm_(cfg.clip) if cfg.clip else None
        opt.step()
        lr = opt.param_groups[0]["lr"]
        sched.step()
        opt.zero_grad(set_to_none=True)
        position += global_batch
        if lead and (step % cfg.log_every == 0 or step == start + 1 or step == cfg.steps):
            value = float(loss)          # the one host sync, on logged steps only
            now = time.perf_counter()
            step_s = (now - t_last) / (step - step_last)
            t_last, step_last = now, step
            result.losses[step] = value
            print_fn(log_line(step, value, step_s, tokens_per_step, plan.world_size,
                              peak_memory_bytes(runner.device), ys, lr,
                              None if norm is None else float(norm)))
        if cfg.save and cfg.save_every and step % cfg.save_every == 0 and step != cfg.steps:
            t_save = time.perf_counter()
            save()
            t_last += time.perf_counter() - t_save   # the next logged step time leaves the save out
    if cfg.save:
        save()
    runner.wait_for_save()
    result.end_step, result.data_position = runner.step, position
    return result


def check_config(cfg: TrainConfig) -> None:
    """One line for each flag out of range, before any process group starts."""
    for name in ("steps", "log_every"):
        if getattr(cfg, name) < 1:
            raise PlanError(f"--{name.replace('_', '-')} {getattr(cfg, name)} must be at least 1")
    for name in ("warmup", "save_every"):
        if getattr(cfg, name) < 0:
            raise PlanError(f"--{name.replace('_', '-')} {getattr(cfg, name)} must be 0 or more")
    if not cfg.lr > 0:
        raise PlanError(f"--lr {cfg.lr} must be positive")
    if cfg.clip is not None and not cfg.clip >= 0:
        raise PlanError(f"--clip {cfg.clip} must be positive (0: no clipping)")
    if cfg.global_batch is not None and cfg.global_batch < 1:
        raise PlanError(f"--global-batch {cfg.global_batch} must be at least 1")
    if cfg.save_every and not cfg.save:
        raise PlanError("--save-every needs --save CKPT (a directory; '{step}' in it keeps one per save)")
