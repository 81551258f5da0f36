"""``python -m autopar.train MODEL --plan ...`` (what ``torchrun -m autopar.train`` runs): the same
command as ``autopar train`` (issue 29), and the Python API a script imports:

    from autopar.train import TrainConfig, train
    result = train(TrainConfig(model="gpt2-small", plan='{"dp": 2}', global_batch=16,
                               data="train.bin", steps=1000))     # on every rank, under torchrun

The loop, its data, schedule and logged figures live in ``autopar.runtime.training``; the flags
in ``autopar.cli.train``.
"""
from __future__ import annotations

import sys

from autopar.runtime.training.loop import TrainConfig, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "main", "train"]


def main(argv: list[str] | None = None) -> int:
    from autopar.cli.main import main as autopar_main
    return autopar_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
