"""Train a small GPT on a real text file under torchrun, with a plan from `autopar search`.

    torchrun --nproc-per-node 2 examples/train_gpt.py --plan '{"dp": 2}'
    torchrun --nproc-per-node 4 examples/train_gpt.py --plan '{"dp": 2, "pp": 2}' --steps 100
    autopar search 'gpt:layers=4,hidden=128,heads=4,vocab=256,seq=64' --gpus 4 ... -o plans.json
    torchrun --nproc-per-node 4 examples/train_gpt.py --plan plans.json      # its model, rank-1 plan

Tokens are bytes (vocabulary 256). The default text is the source of Python's own `argparse`
module (no download); pass --text FILE for yours. Every rank builds the same model from the same
seed and draws the same global batch of random windows; each takes its data-parallel slice
(`runner.dp_rank`, `runner.dp_size`). Rank 0 prints the loss, which falls.
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
    ap.add_argument("--index", type=int, default=0, help="which plan of a plans file")
    ap.add_argument("--model", default=None,
                    help=f"GPT spec with vocab >= 256 (default: the plans file's model, else "
                         f"{DEFAULT_MODEL})")
    ap.add_argument("--text", default=None, help="training text (default: argparse.py's source)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per step (default dp·micro_batch_size·max(8, 2·pp))")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=10)
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
    plan = plans[args.index]
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

    model = source.build("cpu", seed=0, attention=plan.attention)
    runner = autopar.apply(model, plan, loss_fn=source.loss, spec=spec, seq=seq)
    opt = torch.optim.AdamW(runner.parameters(), lr=args.lr)
    per_dp = plan.micro_batch_size * max(8, 2 * plan.pp)
    global_batch = args.global_batch or plan.dp * per_dp
    local = global_batch // runner.dp_size
    lead = runner.rank == runner.layout.ranks[0]
    if lead:
        print(f"text {path} ({data.numel()} bytes), model {spec}, plan {plan.to_json()}, "
              f"global batch {global_batch}, {args.steps} steps", flush=True)

    g = torch.Generator().manual_seed(0)
    first = last = None
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, data.numel() - seq - 1, (global_batch,), generator=g)
        mine = starts[runner.dp_rank * local:(runner.dp_rank + 1) * local]
        x = torch.stack([data[s:s + seq] for s in mine.tolist()])
        y = torch.stack([data[s + 1:s + seq + 1] for s in mine.tolist()])
        loss = runner.train_step(x, y)
        opt.step()
        opt.zero_grad()
        first = loss if first is None else first
        last = loss
        if lead and (step == 1 or step % args.log_every == 0 or step == args.steps):
            print(f"step {step:4d}  loss {loss:.4f}  ({(time.perf_counter() - t0) / step:.3f} s/step)",
                  flush=True)
    if lead:
        print(f"loss {first:.4f} -> {last:.4f} ({'falling' if last < first else 'NOT falling'})")
    state = runner.full_state_dict()
    if lead:
        print(f"gathered {len(state)} tensors of the serial model's state dict on rank 0")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # a clean exit: no gloo thread left running


if __name__ == "__main__":
    main()
