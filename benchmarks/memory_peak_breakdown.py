"""What is live at the peak of a CPU step of autopar's runtime, by the op that allocated it (issue 31).

``autopar validate`` on CPU reports one number per rank (the peak of the torch profiler's live
tensor bytes, autopar/validate/live_bytes.py). This script runs one plan the way validate's
ranks do (build, apply, AdamW, one step, the measured step, one more) under the profiler with
``profile_memory=True`` and, at the measured step's peak, groups the live blocks by when they
were allocated (``build`` = model and runtime construction, ``s0`` / ``s0.opt`` = the first
step and its optimizer step, ``MEM`` / ``MEM.opt`` = the measured step) and by the nearest
named op above the allocating aten op (``ToCopyBackward0`` = fp32 gradients cast back from
bf16, ``AddmmBackward0`` = bf16 weight gradients, ``DistributedDataParallel.forward`` = DDP's
rebuilt buckets and autocast's weight cache, ``Optimizer.step#AdamW.step`` = AdamW's state).
It also lists the bf16 weight gradients (``aten::mm`` under ``AddmmBackward0``) live at the
peak with their allocation and free times relative to it: how the held autocast gradients were
found (fixed since: autopar/runtime/step/schedules.py ``fresh_autocast_casts``).
Frees on threads the profiler does not watch (gloo's worker) are not seen: a block freed there
stays live here.

    python benchmarks/memory_peak_breakdown.py "gpt:layers=8,hidden=384,heads=4,vocab=256,seq=8" \\
        2 8 '{"dp": 2, "pp": 1, "micro_batch_size": 1, "zero": 1, "recompute": "none"}'
"""
from __future__ import annotations

import collections
import gc
import json
import os
import sys

PHASES = ("MEM", "MEM.opt", "s0", "s0.opt", "tail", "tail.opt")


def rank_main(spec, plan_d, global_batch):
    import warnings

    import torch
    import torch.distributed as dist
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    warnings.filterwarnings("ignore")
    adist.ensure_initialized(int(os.environ["WORLD_SIZE"]))
    for mod in ("torch.distributed.pipelining", "torch.distributed.fsdp", "torch.nn.parallel"):
        __import__(mod)
    src = load_model(spec)
    inputs, targets = src.make_batch(global_batch, seed=0)
    plan = Plan.from_dict(plan_d)
    gc.collect()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    prof.__enter__()
    runner = apply(src.build("cpu", seed=0, attention=plan.attention), plan, loss_fn=src.loss, spec=spec)
    opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)
    n = global_batch // runner.dp_size
    sl = slice(runner.dp_rank * n, (runner.dp_rank + 1) * n)
    x, y = tuple(t[sl] for t in inputs), targets[sl]
    gc.collect()

    def step(tag):
        dist.barrier()
        with torch.profiler.record_function(tag):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                runner.train_step(x, y)
            with torch.profiler.record_function(tag + ".opt"):
                opt.step()
            opt.zero_grad(set_to_none=True)
    for tag in ("s0", "MEM", "tail"):
        step(tag)
    prof.__exit__(None, None, None)
    evs, todo, span = [], list(prof.profiler.kineto_results.experimental_event_tree()), None
    while todo:
        e = todo.pop()
        todo.extend(e.children)
        if e.tag == _EventType.Allocation and str(e.extra_fields.device) == "cpu":
            names, p = [], e.parent
            while p is not None and len(names) < 8:
                names.append(p.name)
                p = p.parent
            evs.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size, names))
        elif e.name == "MEM":
            span = (e.start_time_ns, e.end_time_ns)
    evs.sort(key=lambda a: a[0])
    live, total, peak, peak_t, snap = {}, 0, -1, None, {}
    for t, ptr, nb, names in evs:
        if t > span[1]:
            break
        if nb > 0:
            live[ptr] = (nb, names, t)
            total += nb
        elif ptr in live:
            total -= live.pop(ptr)[0]
        if t >= span[0] and total > peak:
            peak, peak_t, snap = total, t, dict(live)
    groups = collections.Counter()
    for nb, names, _ in snap.values():
        phase = next((m for m in names if m in PHASES), "build")
        outer = next((m for m in names if not m.startswith("aten::")), "")
        groups[f"{phase} | {outer[:60]} | {names[0] if names else '?'}"] += nb
    frees = collections.defaultdict(list)
    for t, ptr, nb, _ in evs:
        if nb < 0:
            frees[ptr].append(t)
    mm = sorted(((nb, (t - peak_t) / 1e6, next(((f - peak_t) / 1e6 for f in frees[ptr] if f > t), None))
                 for ptr, (nb, names, t) in snap.items()
                 if names and names[0] == "aten::mm" and "AddmmBackward0" in names), key=lambda d: d[1])
    return dict(rank=dist.get_rank(), peak=peak, groups=groups.most_common(40), mm=mm)


def main() -> int:
    from autopar.runtime.verify.serial import spawn
    spec, nproc, gb, plan = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    for r in spawn(rank_main, nproc, spec, plan, gb):
        print(f"== rank {r['rank']}: peak live {r['peak'] / 1e6:.2f} MB")
        for k, v in r["groups"]:
            if v > 1e5:
                print(f"   {v / 1e6:8.2f} MB  {k}")
        if r["mm"]:
            held = sum(d[0] for d in r["mm"])
            first, last = r["mm"][0], r["mm"][-1]
            print(f"   bf16 weight gradients live at the peak: {len(r['mm'])} blocks, {held / 1e6:.2f} MB, "
                  f"allocated {first[1]:.0f} .. {last[1]:.0f} ms from the peak, freed "
                  f"{min((d[2] for d in r['mm'] if d[2] is not None), default=float('nan')):.0f} .. "
                  f"{max((d[2] for d in r['mm'] if d[2] is not None), default=float('nan')):.0f} ms after it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
