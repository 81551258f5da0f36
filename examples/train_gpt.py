"""Train a small GPT on the bytes of a text file: a thin user of ``autopar.train`` (the training
loop ships in the package: ``torchrun -m autopar.train`` / ``autopar train``).

    torchrun --nproc-per-node 2 examples/train_gpt.py --plan '{"dp": 2}'
    torchrun --nproc-per-node 4 examples/train_gpt.py --plan '{"dp": 2, "pp": 2}' --steps 100

What it adds to ``autopar train``: the data. Tokens are bytes (vocabulary 256) of ``--text``
(default: the source of Python's own ``argparse`` module, no download), written once as a flat
uint16 token file — the format of nanoGPT's ``prepare.py`` that ``autopar train --data`` reads.
Everything else (plans files, ``--save``/``--resume`` under another plan, logs with tokens/s and
MFU) is ``autopar.train``'s; see ``python -m autopar.train --help``.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import tempfile

import numpy as np

from autopar.train import TrainConfig, train

DEFAULT_MODEL = "gpt:layers=4,hidden=128,heads=4,vocab=256,seq=64,dropout=0"


def byte_tokens(text_path: str) -> str:
    """The text's bytes as a uint16 token file (one per content, written atomically: every rank
    may write it at once)."""
    with open(text_path, "rb") as f:
        raw = f.read()
    out = os.path.join(tempfile.gettempdir(), f"autopar_bytes_{hashlib.sha1(raw).hexdigest()[:12]}.bin")
    if not os.path.exists(out):
        tmp = f"{out}.{os.getpid()}.tmp"
        np.frombuffer(raw, dtype=np.uint8).astype(np.uint16).tofile(tmp)
        os.replace(tmp, out)
    return out


def main() -> None:
    import argparse as argparse_module
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default=None, help="plan JSON, plan file or plans file (default: dp over all ranks)")
    ap.add_argument("--index", type=int, default=1, help="which plan of a plans file, from 1")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a gpt/llama spec with vocab >= 256")
    ap.add_argument("--text", default=argparse_module.__file__, help="training text")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--global-batch", type=int, default=None, help="default 8 sequences per dp rank")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--save", default=None)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--resume", default=None)
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = args.plan or f'{{"dp": {world}}}'
    batch = args.global_batch
    if batch is None and not args.resume:
        from costmodels.contracts.plans_file import PlansFile
        p = PlansFile.read(plan).plans[args.index - 1]
        batch = p.dp * p.micro_batch_size * max(8, 2 * p.pp)
    result = train(TrainConfig(model=args.model, plan=plan, index=args.index, global_batch=batch,
                               data=byte_tokens(args.text), steps=args.steps, lr=args.lr,
                               log_every=args.log_every, save=args.save, save_every=args.save_every,
                               resume=args.resume, compile=False))
    if result.losses:
        first, last = result.losses[min(result.losses)], result.losses[max(result.losses)]
        print(f"loss {first:.4f} -> {last:.4f} ({'falling' if last < first else 'NOT falling'})")
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()   # a clean exit: no gloo thread left running


if __name__ == "__main__":
    main()
