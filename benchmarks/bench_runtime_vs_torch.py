"""Step time of the autopar runner against hand-written torch, 2 ranks on gloo (CPU).

* pure data parallel, plan {"dp": 2}: autopar.apply vs the model wrapped in plain
  ``DistributedDataParallel`` (same local batch in one micro-batch, SGD step included);
* pure pipeline parallel, plan {"pp": 2, "schedule": "1f1b"}: autopar.apply vs a hand-built
  ``torch.distributed.pipelining`` PipelineStage + Schedule1F1B over the same two halves;
* zero-bubble (issue 14), plans {"pp": 2, "vpp": 2, "schedule": "interleaved-zb" | "zb-v" |
  "dualpipe-v"}: autopar.apply vs hand-built PipelineStages (the same four virtual stages, placed
  as ``costmodels.contracts.plan.stages_of_rank`` says: a loop, or the V) under torch's own
  ScheduleInterleavedZeroBubble / ScheduleZBVZeroBubble / ScheduleDualPipeV.

Prints the median step time of each (after warm-up; the best of several alternating rounds, as
the host may be shared) and the ratio autopar / torch (target ≤ 1.05).

* single process (issue 29, ``single_process``): plan
  {"dp": 1} at ``--micro-batches`` micro-batches against a plain torch loop over the same model,
  batch and AdamW (loss divided per micro-batch, kept on the device, one sync at the step's end
  on both sides), eager and with each row compiled (``apply(..., compile=True)`` against the same
  rows ``.compile()``d by hand). On CUDA (when there is one): bf16 autocast on both sides, the
  ratio target ≤ 1.01; on CPU ≤ 1.02. ``--single-only`` skips the 2-rank gloo cases.

    python benchmarks/bench_runtime_vs_torch.py [--steps 20] [--model SPEC]
    python benchmarks/bench_runtime_vs_torch.py --single-only --model gpt2-medium --global-batch 16 --micro-batches 8
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

DEFAULT_MODEL = "gpt:layers=4,hidden=256,heads=4,vocab=2048,seq=128,dropout=0"


def _timed(step, n_warm: int, n: int) -> float:
    import torch.distributed as dist
    for _ in range(n_warm):
        step()
    times = []
    for _ in range(n):
        dist.barrier()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class _Half(nn.Module):
    def __init__(self, parts):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x):
        for p in self.parts:
            x = p(x)
        return x


def _rank(spec: str, steps: int, global_batch: int, n_micro: int, rounds: int):
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autopar
    from autopar.models import load_model
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    source = load_model(spec)
    inputs, targets = source.make_batch(global_batch, seed=0)
    idx = inputs[0]
    local = global_batch // 2
    mine = slice(rank * local, (rank + 1) * local)
    out = {}

    # ---- pure DP ----------------------------------------------------------------------------
    plan = autopar.Plan(dp=2, micro_batch_size=local)
    runner = autopar.apply(source.build("cpu", seed=0), plan, loss_fn=source.loss, spec=spec)
    opt = torch.optim.SGD(runner.parameters(), lr=1e-3)

    def ap_dp():
        runner.train_step(idx[mine], targets[mine])
        opt.step()
        opt.zero_grad()

    import warnings
    warnings.simplefilter("ignore", FutureWarning)
    ddp = DDP(source.build("cpu", seed=0), broadcast_buffers=False)
    opt2 = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def torch_dp(ddp=ddp):
        loss = source.loss(ddp(idx[mine]), targets[mine])
        loss.backward()
        opt2.step()
        opt2.zero_grad()

    for name, fn in (("autopar_dp", ap_dp), ("torch_ddp", torch_dp)) * rounds:
        out.setdefault(name, []).append(_timed(fn, 2, steps))
    del runner, ddp

    # ---- pure PP ----------------------------------------------------------------------------
    model = source.build("cpu", seed=0)
    n_rows = len(model.blocks) + 2
    cut = n_rows // 2
    plan = autopar.Plan(pp=2, schedule="1f1b", stages=((0, cut), (cut, n_rows)))
    runner = autopar.apply(model, plan, loss_fn=source.loss, spec=spec)
    opt = torch.optim.SGD(runner.parameters(), lr=1e-3)

    def ap_pp():
        runner.train_step(idx, targets)
        opt.step()
        opt.zero_grad()

    model = source.build("cpu", seed=0)
    rows = [model.embedding, *model.blocks, model.head]
    half = _Half(rows[:cut] if rank == 0 else rows[cut:])
    stage = PipelineStage(half, rank, 2, torch.device("cpu"))
    sched = Schedule1F1B(stage, n_micro, loss_fn=source.loss)
    opt3 = torch.optim.SGD(half.parameters(), lr=1e-3)

    def torch_pp():
        if rank == 0:
            sched.step(idx)
        else:
            sched.step(target=targets, losses=[])
        opt3.step()
        opt3.zero_grad()

    for name, fn in (("autopar_pp", ap_pp), ("torch_pp", torch_pp)) * rounds:
        out.setdefault(name, []).append(_timed(fn, 2, steps))

    # ---- zero-bubble and V schedules: four virtual stages on two ranks ------------------------
    for schedule, cls in ZERO_BUBBLE.items():
        ap_zb, torch_zb = _zero_bubble_pair(source, spec, schedule, cls, idx, targets, n_micro, rank)
        for name, fn in ((f"autopar_{schedule}", ap_zb), (f"torch_{schedule}", torch_zb)) * rounds:
            out.setdefault(name, []).append(_timed(fn, 2, steps))
    dist.barrier()
    return {k: min(v) for k, v in out.items()}


# the plan's schedule name -> torch's class (torch.distributed.pipelining)
ZERO_BUBBLE = {"interleaved-zb": "ScheduleInterleavedZeroBubble", "zb-v": "ScheduleZBVZeroBubble",
               "dualpipe-v": "ScheduleDualPipeV"}


def _zero_bubble_pair(source, spec, schedule, cls, idx, targets, n_micro, rank):
    """(autopar step, torch step) for ``schedule`` over the same four virtual stages."""
    from torch.distributed import pipelining as pl

    import autopar
    model = source.build("cpu", seed=0)
    n_rows = len(model.blocks) + 2
    cuts = [0, *(round(n_rows * k / 4) for k in (1, 2, 3)), n_rows]
    stages = tuple(zip(cuts[:-1], cuts[1:]))
    plan = autopar.Plan(pp=2, vpp=2, schedule=schedule, stages=stages)
    runner = autopar.apply(model, plan, loss_fn=source.loss, spec=spec)
    opt = torch.optim.SGD(runner.parameters(), lr=1e-3)

    def ap():
        runner.train_step(idx, targets)
        opt.step()
        opt.zero_grad()

    model = source.build("cpu", seed=0)
    rows = [model.embedding, *model.blocks, model.head]
    local = plan.stages_of_rank(rank)
    chunks = [_Half(rows[stages[v][0]:stages[v][1]]) for v in local]
    pipe = [pl.PipelineStage(c, v, 4, torch.device("cpu")) for c, v in zip(chunks, local)]
    sched = getattr(pl, cls)(pipe, n_micro, loss_fn=source.loss)
    params = list({id(p): p for c in chunks for p in c.parameters()}.values())
    opt2 = torch.optim.SGD(params, lr=1e-3)
    first, last = 0 in local, 3 in local

    def by_hand():
        kwargs = dict(target=targets, losses=[]) if last else {}
        sched.step(*((idx,) if first else ()), **kwargs)
        opt2.step()
        opt2.zero_grad()

    return ap, by_hand


def single_process(spec: str, steps: int, global_batch: int, n_micro: int, rounds: int,
                   compile: bool) -> dict[str, float]:
    """Median step time (s) of autopar (plan dp=1) and of a plain torch loop, same model, batch,
    micro-batches and AdamW; best of ``rounds`` alternating rounds."""
    import contextlib

    import autopar
    from autopar.models import load_model
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    source = load_model(spec)
    inputs, targets = source.make_batch(global_batch, seed=0, device=device)
    idx = inputs[0]
    mb = global_batch // n_micro
    import torch.distributed as dist
    if not dist.is_initialized():   # a world of one: NCCL on a GPU puts the runner there
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    cast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext

    runner = autopar.apply(source.build(device, seed=0), {"dp": 1, "micro_batch_size": mb},
                           loss_fn=source.loss, spec=spec, compile=compile)
    opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)

    def ap():
        with cast():
            loss = runner.train_step(idx, targets, sync=False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    model = source.build(device, seed=0)
    if compile:   # the same rows autopar compiles: embedding, each block, head
        for row in (model.embedding, *model.blocks, model.head):
            row.compile()
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def plain():
        total = None
        for i in range(n_micro):
            sl = slice(i * mb, (i + 1) * mb)
            with cast():
                loss = source.loss(model(idx[sl]), targets[sl])
            (loss / n_micro).backward()
            total = loss.detach() if total is None else total + loss.detach()
        opt2.step()
        opt2.zero_grad(set_to_none=True)
        return total / n_micro

    # CPU: this process's CPU seconds (one thread: OMP_NUM_THREADS=1), which other jobs on a
    # shared host do not inflate as they do wall time; CUDA: wall time
    clock = time.perf_counter if cuda else time.process_time

    def timed(step):
        for _ in range(3):
            float(step())
        times = []
        for _ in range(steps):
            t = clock()
            float(step())            # the step's one sync, on both sides
            times.append(clock() - t)
        return statistics.median(times)

    out: dict[str, list[float]] = {}
    for name, fn in (("autopar", ap), ("torch", plain)) * rounds:
        out.setdefault(name, []).append(timed(fn))
    return {k: min(v) for k, v in out.items()}


def print_single(args) -> None:
    where = (f"CUDA {torch.cuda.get_device_name()} bf16 autocast, wall time" if torch.cuda.is_available()
             else f"CPU fp32, process CPU time, {torch.get_num_threads()} thread(s)")
    target = 1.01 if torch.cuda.is_available() else 1.02
    print(f"single process, {where}: model {args.model}, global batch {args.global_batch} in "
          f"{args.micro_batches} micro-batches, AdamW, median of {args.steps} steps, best of "
          f"{args.rounds} alternating rounds")
    print(f"{'':<26}{'autopar s/step':>16}{'torch s/step':>14}{'ratio':>8}")
    eager = None
    for compiled in (False, True):
        r = single_process(args.model, args.steps, args.global_batch, args.micro_batches,
                           args.rounds, compiled)
        ratio = r["autopar"] / r["torch"]
        label = "dp=1 compiled" if compiled else "dp=1 eager"
        extra = f"   compiled/eager speed-up {eager / r['autopar']:.2f}x" if compiled else ""
        eager = r["autopar"]
        print(f"{label:<26}{r['autopar']:>16.4f}{r['torch']:>14.4f}{ratio:>8.3f}"
              f"{'' if ratio <= target else f'   (> {target} target)'}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4,
                    help="alternating autopar/torch rounds; the best median counts (default 4)")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=4,
                    help="micro-batches of the single-process case (default 4)")
    ap.add_argument("--single-only", action="store_true", help="only the single-process case")
    args = ap.parse_args()
    print_single(args)
    if args.single_only:
        return
    from autopar.runtime.verify.serial import spawn
    n_micro = args.global_batch  # micro-batch 1 for the pipeline comparison
    res = spawn(_rank, 2, args.model, args.steps, args.global_batch, n_micro, args.rounds)
    r = {k: max(x[k] for x in res) for k in res[0]}  # the slower rank sets the step time
    print(f"model {args.model}, 2 ranks on gloo, global batch {args.global_batch}, "
          f"median of {args.steps} steps, best of {args.rounds} alternating rounds")
    print(f"{'plan':<26}{'autopar s/step':>16}{'torch s/step':>14}{'ratio':>8}")
    pairs = [("dp=2 vs DDP", "autopar_dp", "torch_ddp"),
             ("pp=2 1f1b vs pipelining", "autopar_pp", "torch_pp")]
    pairs += [(f"pp=2 vpp=2 {s}", f"autopar_{s}", f"torch_{s}") for s in ZERO_BUBBLE]
    for label, a, t in pairs:
        ratio = r[a] / r[t]
        print(f"{label:<26}{r[a]:>16.4f}{r[t]:>14.4f}{ratio:>8.3f}"
              f"{'' if ratio <= 1.05 else '   (> 1.05 target)'}")


if __name__ == "__main__":
    main()
