"""``autopar train``: a training entry point over ``autopar.apply`` (issue 29).

    torchrun --nproc-per-node 4 -m autopar.train gpt:layers=12,hidden=768,heads=12 \\
        --plan '{"dp": 2, "pp": 2}' --global-batch 8 --data train.bin --steps 1000 \\
        --save 'ck_{step}' --save-every 100 --hardware h100-80g-sxm

From Python: ``autopar.train.train(TrainConfig(model=..., plan=..., ...))`` on every rank.
The loop is ``autopar.train.loop``; data ``autopar.train.data``; the optimizer and its schedule
``autopar.train.schedule``; the logged figures ``autopar.train.metrics``.
"""
from autopar.train.loop import TrainConfig, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train"]
