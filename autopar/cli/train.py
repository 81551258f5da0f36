"""``autopar train MODEL --plan P --global-batch B --data PATH|random --steps N ...`` (also
``python -m autopar.train``): flags → ``TrainConfig`` → ``autopar.runtime.training.loop.train``."""
from __future__ import annotations

import argparse

from autopar.cli.common import add_model_args, float_arg, int_arg
from costmodels.contracts.errors import AutoparError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train MODEL under a plan (run it under torchrun)",
        description="Train MODEL under PLAN on the ranks torchrun started: a token file (flat "
                    "uint16/uint32, nanoGPT's prepare.py) or random data, AdamW with warm-up and "
                    "cosine decay, clipping by the serial model's norm, checkpoints any plan can "
                    "resume. Rank 0 logs loss, tokens/s per GPU, MFU and peak memory per step, "
                    "and the plan's predicted step time beside the measured one (--hardware).")
    add_model_args(p)
    p.add_argument("--plan", required=True,
                   help="plan: JSON text, a plan file, or a plans file from 'autopar search' / "
                        "'autopar replan' (its --index-th plan)")
    p.add_argument("--index", type=int_arg(low=1, high=10 ** 6), default=1,
                   help="which plan of a plans file, counted from 1 as the tables number them (default 1)")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), default=None,
                   help="sequences per optimizer step over all dp ranks (default: the plans "
                        "file's, else the checkpoint's on --resume)")
    p.add_argument("--data", default="random",
                   help="token file (flat uint16 ids, nanoGPT's train.bin) or 'random' (default)")
    p.add_argument("--data-dtype", choices=("uint16", "uint32"), default=None,
                   help="token type of --data (default: uint16 when the vocabulary fits, else uint32)")
    p.add_argument("--steps", type=int_arg(low=1, high=10 ** 9), required=True,
                   help="train up to this step (a resumed run continues from its checkpoint's step)")
    p.add_argument("--lr", type=float_arg(high=10.0), default=3e-4, help="peak learning rate (default 3e-4)")
    p.add_argument("--warmup", type=int_arg(low=0, high=10 ** 9), default=0,
                   help="linear warm-up steps, then cosine decay to lr/10 at --steps (default 0)")
    p.add_argument("--clip", type=float_arg(), default=1.0,
                   help="clip gradients to this global norm (runner.clip_grad_norm_; 0: off; default 1)")
    p.add_argument("--weight-decay", type=float_arg(), default=0.1, help="AdamW weight decay (default 0.1)")
    p.add_argument("--save", default=None, help="checkpoint directory; '{step}' in it keeps one per save")
    p.add_argument("--save-every", type=int_arg(low=0, high=10 ** 9), default=0,
                   help="also save every K steps (default: only at the end)")
    p.add_argument("--resume", default=None, help="checkpoint to resume (saved under any plan)")
    p.add_argument("--log-every", type=int_arg(low=1, high=10 ** 9), default=1,
                   help="log every K steps; the host waits for the device only then (default 1)")
    p.add_argument("--hardware", default=None,
                   help="hardware profile for MFU and the predicted step time (autopar hardware)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each row (default: on with CUDA, off on CPU)")
    p.add_argument("--seed", type=int_arg(low=0, high=2 ** 63 - 1), default=0,
                   help="weights' and random data's seed (default 0)")
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.runtime.training.loop import TrainConfig, train
    cfg = TrainConfig(model=args.model, plan=args.plan, global_batch=args.global_batch,
                      data=args.data, steps=args.steps, index=args.index, seq=args.seq,
                      lr=args.lr, warmup=args.warmup, clip=args.clip or None,
                      weight_decay=args.weight_decay, save=args.save, save_every=args.save_every,
                      resume=args.resume, log_every=args.log_every, hardware=args.hardware,
                      compile=args.compile, seed=args.seed, data_dtype=args.data_dtype)
    try:
        train(cfg, print_fn=lambda line: print(line, flush=True))
    except AutoparError as e:
        _quiet_unless_printer(e)
        raise
    _finish()
    return 0


def _quiet_unless_printer(e) -> None:
    """Under a launcher, one rank prints an error every rank raised alike (rank 0) or the rank
    that saw a peer fail; the others exit 1 without a word, after the printer had time to print
    (``autopar.runtime.faults.failures``, as its excepthook does for a user's script)."""
    import os
    import time

    from autopar.runtime.faults.failures import QUIET_EXIT_DELAY_S
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    printer = 0 if getattr(e, "same_on_every_rank", False) else getattr(e, "reporting_rank", rank)
    if world > 1 and printer != rank:
        time.sleep(QUIET_EXIT_DELAY_S)
        raise SystemExit(1)


def _finish() -> None:
    """A clean exit: every rank done, no gloo thread left running."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
