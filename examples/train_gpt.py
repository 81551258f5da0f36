"""Train a small GPT on a real text file under torchrun, with a plan from `autopar search`.

    torchrun --nproc-per-node 2 examples/train_gpt.py --plan '{"dp": 2}'
    torchrun --nproc-per-node 4 examples/train_gpt.py --plan '{"dp": 2, "pp": 2}' --steps 100
    autopar search 'gpt:layers=4,hidden=128,heads=4,vocab=256,seq=64' --gpus 4 ... -o plans.json
    torchrun --nproc-per-node 4 examples/train_gpt.py --plan plans.json      # its model, rank-1 plan

Save, lose two GPUs, resume on the others under a new plan (the checkpoint reshards):

    torchrun --nproc-per-node 4 examples/train_gpt.py --plan '{"dp": 2, "pp": 2}' --steps 20 --save ckpt
    autopar replan ckpt --gpus 2 --hardware a100-80gb-nvlink -o replan.json
    torchrun --nproc-per-node 2 examples/train_gpt.py --plan replan.json --steps 40 --resume ckpt

Tokens are bytes (vocabulary 256). The default text is the source of Python's own `argparse`
module (no download); pass --text FILE for yours. Every rank builds the same model from the same
seed and draws the same global batch of random windows; each takes its data-parallel slice
(`runner.dp_rank`, `runner.dp_size`). Rank 0 prints the loss, which falls.

The model is built on `meta` and each rank materialises only its rows (`source.build_meta()`,
`apply(..., seed=0)`). `--save DIR` writes a distributed checkpoint at the end (and every
`--save-every` steps) with the data position as `extra`; `--resume DIR` loads it under whatever
plan this run has and continues from the saved step with the saved global batch and data order.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

import autopar
from autopar.models import load_model

DEFAULT_MODEL = "gpt:layers=4,hidden=128,heads=4,vocab=256,seq=64,dropout=0"


def default_text() -> str:
    import argparse as module
    return module.__file__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default=None,
                    help="plan JSON text, plan file or plans file (default: pure data parallel "
                         "over all ranks)")
    ap.add_argument("--index", type=int, default=1,
                    help="which plan of a plans file, numbered from 1 as autopar's tables (default 1)")
    ap.add_argument("--model", default=None,
                    help=f"GPT spec with vocab >= 256 (default: the plans file's model, else "
                         f"{DEFAULT_MODEL})")
    ap.add_argument("--text", default=None, help="training text (default: argparse.py's source)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per step (default dp·micro_batch_size·max(8, 2·pp))")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--save", default=None,
                    help="checkpoint directory to write ('{step}' in it: one per save)")
    ap.add_argument("--save-every", type=int, default=0, help="also save every N steps")
    ap.add_argument("--resume", default=None, help="checkpoint directory to resume from")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    spec, seq = args.model, None
    if args.plan is None:
        plans = [autopar.Plan(dp=world)]
    else:
        plans = autopar.load_plans(args.plan)
        if spec is None and not args.plan.lstrip().startswith(("{", "[")):
            with open(args.plan, encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict) and data.get("model"):
                spec, seq = data["model"], data.get("seq")
    if not 1 <= args.index <= len(plans):
        raise SystemExit(f"train_gpt.py: --index counts plans from 1 (as autopar's tables); "
                         f"give 1 to {len(plans)}")
    plan = plans[args.index - 1]
    spec = spec or DEFAULT_MODEL
    source = load_model(spec, seq=seq)
    cfg = source.config
    if cfg is None or cfg.family not in ("gpt", "llama") or cfg.vocab < 256:
        raise SystemExit(f"train_gpt.py: --model must be a gpt/llama spec with vocab >= 256 "
                         f"(byte tokens), got {spec!r}")
    seq = source.seq

    path = args.text or default_text()
    with open(path, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    if data.numel() <= seq + 1:
        raise SystemExit(f"train_gpt.py: {path} is shorter than one sequence of {seq} bytes")

    model = source.build_meta(attention=plan.attention)   # each rank materialises its rows only
    runner = autopar.apply(model, plan, loss_fn=source.loss, spec=spec, seq=seq, seed=0)
    opt = torch.optim.AdamW(runner.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(0)
    start, saved_batch = 1, None
    if args.resume:
        extra = runner.load(args.resume, optimizer=opt)   # resharded from the plan that saved it
        g.set_state(extra["data_rng"])
        start, saved_batch = runner.step + 1, extra["global_batch"]
    per_dp = plan.micro_batch_size * max(8, 2 * plan.pp)
    global_batch = args.global_batch or saved_batch or plan.dp * per_dp
    local = global_batch // runner.dp_size
    lead = runner.rank == runner.layout.ranks[0]
    if lead:
        print(f"text {path} ({data.numel()} bytes), model {spec}, plan {plan.to_json()}, "
              f"global batch {global_batch}, steps {start}..{args.steps}"
              f"{f' (resumed from {args.resume})' if args.resume else ''}", flush=True)

    first = last = None
    t0 = time.perf_counter()

    def save():
        path = args.save.replace("{step}", str(runner.step))
        runner.save(path, optimizer=opt, extra={"data_rng": g.get_state(), "global_batch": global_batch})
        if lead:
            print(f"saved step {runner.step} to {path}", flush=True)

    for step in range(start, args.steps + 1):
        starts = torch.randint(0, data.numel() - seq - 1, (global_batch,), generator=g)
        mine = starts[runner.dp_rank * local:(runner.dp_rank + 1) * local]
        x = torch.stack([data[s:s + seq] for s in mine.tolist()])
        y = torch.stack([data[s + 1:s + seq + 1] for s in mine.tolist()])
        loss = runner.train_step(x, y)
        opt.step()
        opt.zero_grad()
        first = loss if first is None else first
        last = loss
        if lead and (step == start or step % args.log_every == 0 or step == args.steps):
            print(f"step {step:4d}  loss {loss:.4f}  "
                  f"({(time.perf_counter() - t0) / (step - start + 1):.3f} s/step)", flush=True)
        if args.save and args.save_every and step % args.save_every == 0 and step != args.steps:
            save()
    if args.save:
        save()
    if lead and first is not None:
        print(f"loss {first:.4f} -> {last:.4f} ({'falling' if last < first else 'NOT falling'})")
    state = runner.full_state_dict()
    if lead:
        print(f"gathered {len(state)} tensors of the serial model's state dict on rank 0")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # a clean exit: no gloo thread left running


if __name__ == "__main__":
    main()
