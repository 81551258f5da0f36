"""CPU time of one rank's step by category for a dp=2 plan and a tp=2 (sequence-parallel) plan of
the validate model, 2 local ranks (torch.profiler shares × the step's CPU time, as
bench_validate_terms.py does for one process).

    python benchmarks/bench_validate_tp.py
"""
import time

import torch

SPEC = "gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256"
PLANS = [{"dp": 2, "tp": 1, "pp": 1, "micro_batch_size": 4, "zero": 1, "attention": "flash"},
         {"dp": 1, "tp": 2, "pp": 1, "micro_batch_size": 4, "sequence_parallel": True, "attention": "flash"}]


def _category(key: str) -> str:
    if key in ("aten::mm", "aten::addmm", "aten::bmm"):
        return "matmul"
    if "scaled_dot" in key:
        return "attention"
    if "log_softmax" in key or "nll_loss" in key:
        return "loss"
    if key in ("aten::copy_", "aten::_to_copy"):
        return "casts"
    if any(s in key.lower() for s in ("gloo", "c10d", "all_gather", "reduce_scatter", "all_reduce")):
        return "collectives"
    return "other"


def rank_fn(plan_d):
    import warnings
    warnings.filterwarnings("ignore")
    from torch.profiler import ProfilerActivity, profile

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    adist.ensure_initialized(2)
    src = load_model(SPEC)
    runner = apply(src.build("cpu", seed=0, attention="flash"), Plan.from_dict(plan_d), loss_fn=src.loss, spec=SPEC)
    opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)
    x, y = src.make_batch(8, seed=0)
    n = 8 // runner.dp_size
    sl = slice(runner.dp_rank * n, (runner.dp_rank + 1) * n)
    x, y = tuple(t[sl] for t in x), y[sl]

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runner.train_step(x, y)
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    c0 = time.process_time()
    for _ in range(3):
        step()
    cpu = (time.process_time() - c0) / 3
    with profile(activities=[ProfilerActivity.CPU]) as p:
        step()
    cats, opt_t = {}, 0.0
    for e in p.key_averages():
        if e.key.startswith("Optimizer.step"):
            opt_t = e.cpu_time_total / 1e6
            continue
        c = _category(e.key)
        cats[c] = cats.get(c, 0.0) + e.self_cpu_time_total / 1e6
    cats["other"] -= opt_t
    cats["optimizer"] = opt_t
    tot = sum(cats.values())
    top = [(e.key, round(e.self_cpu_time_total / 1e6, 4))
           for e in sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]]
    return {"cpu": cpu, "share": {k: round(v / tot, 3) for k, v in cats.items()},
            "sec": {k: round(v / tot * cpu, 4) for k, v in cats.items()}, "top": top}


if __name__ == "__main__":
    from autopar.runtime.verify.serial import spawn
    for pd in PLANS:
        r = spawn(rank_fn, 2, pd)[0]
        print(pd)
        print(" cpu", round(r["cpu"], 3), r["sec"])
        print(" top", r["top"])
