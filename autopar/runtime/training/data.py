"""Training data for ``autopar train``: a flat token file or random tokens, read by each dp rank
at its own offsets.

The token file is what nanoGPT's ``data/*/prepare.py`` writes: one flat array of token ids,
``uint16`` (``np.memmap(path, dtype=np.uint16)``; vocabularies up to 65,536) or ``uint32``
(larger ones; ``--data-dtype`` or a ``.u32``/``.uint32`` suffix). Unlike nanoGPT's random
windows, the order is a fixed walk: the step's global batch is samples ``position ..
position + global_batch - 1`` of the stream, sample ``i`` the window starting at token
``(i · seq) mod (tokens − seq − 1)``, and dp rank ``d`` reads only its ``global_batch / dp``
samples of it. The position (samples consumed) is all a checkpoint needs to continue the same
order under another plan — another dp changes which rank reads a sample, not which samples a
step reads.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from costmodels.contracts.errors import SpecError

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def token_dtype(path: str, asked: str | None, vocab: int | None) -> np.dtype:
    """The file's token type: ``asked``, else a ``.u32``/``.uint32`` suffix, else uint16 when
    the vocabulary fits it (nanoGPT's default) and uint32 otherwise."""
    if asked is not None:
        return np.dtype(DTYPES[asked])
    if path.endswith((".u32", ".uint32")):
        return np.dtype(np.uint32)
    return np.dtype(np.uint16 if vocab is None or vocab <= 2 ** 16 else np.uint32)


class TokenFile:
    """Windows of ``seq + 1`` tokens from a memmap; ``batch(position, count)`` → (inputs, targets)."""

    def __init__(self, path: str, seq: int, vocab: int | None = None, dtype: str | None = None):
        if not os.path.isfile(path):
            raise SpecError(f"--data {path}: no such file; give a token file (nanoGPT prepare.py's "
                            "train.bin: flat uint16 token ids) or 'random'")
        self.path, self.seq = path, seq
        self.dtype = token_dtype(path, dtype, vocab)
        size = os.path.getsize(path)
        if size % self.dtype.itemsize:
            raise SpecError(f"--data {path}: {size} bytes is not a whole number of "
                            f"{self.dtype.name} tokens; pass --data-dtype uint16 or uint32")
        self.tokens = np.memmap(path, dtype=self.dtype, mode="r")
        if len(self.tokens) < seq + 2:
            raise SpecError(f"--data {path}: {len(self.tokens)} tokens, fewer than one sequence of "
                            f"{seq} + 1; use a longer file or a smaller --seq")
        self.windows = len(self.tokens) - seq - 1
        if vocab is not None:
            top = int(self.tokens[: min(len(self.tokens), 1 << 20)].max())
            if top >= vocab:
                raise SpecError(f"--data {path}: token id {top} >= the model's vocabulary {vocab}; "
                                "the file was tokenised for another model (or --data-dtype is wrong)")

    def batch(self, position: int, count: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
        starts = [((position + i) * self.seq) % self.windows for i in range(count)]
        rows = np.stack([np.asarray(self.tokens[s:s + self.seq + 1], dtype=np.int64) for s in starts])
        t = torch.from_numpy(rows)
        return (t[:, :-1].contiguous(),), t[:, 1:].contiguous()


class RandomTokens:
    """The model's own random batches (``ModelSource.make_batch``), sample ``i`` seeded by
    (seed, i): any model source, the same samples whatever the dp."""

    def __init__(self, source, seed: int = 0):
        self.source, self.seed = source, seed

    def batch(self, position: int, count: int):
        parts = [self.source.make_batch(1, seed=self.seed * 1_000_003 + position + i) for i in range(count)]
        inputs = tuple(torch.cat([p[0][k] for p in parts]) for k in range(len(parts[0][0])))
        targets = None if parts[0][1] is None else torch.cat([p[1] for p in parts])
        return inputs, targets


def open_data(data: str, source, dtype: str | None = None, seed: int = 0):
    """``--data``: 'random' or a token file (for token models: its vocabulary is checked)."""
    if data == "random":
        return RandomTokens(source, seed)
    cfg = source.config
    if cfg is not None and cfg.family not in ("gpt", "llama"):
        raise SpecError(f"--data {data}: a token file feeds a token model (gpt, llama, a causal LM); "
                        f"{source.spec} takes other inputs: use --data random")
    return TokenFile(data, source.seq, vocab=getattr(cfg, "vocab", None), dtype=dtype)


def local_batch(data, position: int, global_batch: int, dp_rank: int, dp_size: int):
    """This dp rank's share of the step whose global batch starts at sample ``position``."""
    local = global_batch // dp_size
    return data.batch(position + dp_rank * local, local)
