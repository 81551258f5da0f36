"""Cut a model into the layer table's rows: embedding, blocks.0 … blocks.L-1, head.

Any contiguous range of rows is a pipeline stage: a row takes what the previous row returned
(one tensor, or a tuple of tensors that it unpacks) and returns what the next one takes.

* Built-in models (``autopar/models``) have top-level children ``embedding``, ``blocks``
  (ModuleList) and ``head``: the rows are those modules themselves.
* Any other model (nanoGPT / minGPT as written, transformers models, torchtitan's ModuleDict of
  blocks): the trace's own cutter, ``autopar.trace.cut.cut_rows``, on the graph the layer table
  is priced on — extra block inputs (masks, position ids, rotary tables) are carried across
  every cut, the output reduced to the logits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from costmodels.contracts.errors import PlanError


@dataclass
class Rows:
    modules: list[nn.Module]
    kinds: list[str]            # "embedding" | "block" | "head"
    names: list[str]            # "embedding", "blocks.3", "head" (or the user model's block path)
    prefixes: list[str]         # where the row's parameter names sit in the model's state dict

    def __len__(self) -> int:
        return len(self.modules)


def model_rows(model: nn.Module, example_inputs=None, leaf_modules=()) -> Rows:
    """The model's rows; ``example_inputs`` (one micro-batch) is needed for any model that is
    not built-in (its forward is cut by ``autopar.trace.cut``, which fixes shapes to them)."""
    children = dict(model.named_children())
    if ("embedding" in children and "head" in children
            and isinstance(children.get("blocks"), nn.ModuleList)):
        blocks = list(model.blocks)
        names = ["embedding"] + [f"blocks.{i}" for i in range(len(blocks))] + ["head"]
        return Rows([model.embedding, *blocks, model.head],
                    ["embedding"] + ["block"] * len(blocks) + ["head"], names, names)
    if example_inputs is None:
        raise PlanError(f"to cut {type(model).__name__} into rows autopar traces its forward on one "
                        "micro-batch: pass example_inputs= (or spec=) to autopar.apply")
    from autopar.trace.cut import cut_rows
    from autopar.trace.driver import leaf_classes
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    cut = cut_rows(model, inputs, leaf_classes=leaf_classes(leaf_modules))
    prefixes = [n if k == "block" else "" for n, k in zip(cut.names, cut.kinds)]
    return Rows(cut.modules, cut.kinds, cut.names, prefixes)


class StageModule(nn.Module):
    """A contiguous range of rows run one after the other (one pipeline virtual stage)."""

    def __init__(self, rows: list[nn.Module], kinds: list[str]):
        super().__init__()
        self.rows = nn.ModuleList(rows)
        self.kinds = list(kinds)

    def forward(self, *args):
        x = self.rows[0](*args)
        for row in self.rows[1:]:
            x = row(*x) if isinstance(x, tuple) else row(x)
        return _contiguous(x)


def _contiguous(x):
    """What a stage returns, each tensor contiguous: a pipeline stage sends it as is, and the
    send needs contiguous memory (a ConvNeXt block ends in a permute; T5 returns transposes).
    A no-op for a tensor that already is."""
    if isinstance(x, tuple):
        return tuple(t.contiguous() if isinstance(t, torch.Tensor) else t for t in x)
    return x.contiguous() if isinstance(x, torch.Tensor) else x


def row_weights(rows: Rows) -> list[float]:
    """A FLOP proxy per row when no layer table is at hand: matmul parameters (an embedding
    lookup costs ~nothing, a linear 6 FLOPs per parameter per token) plus one."""
    out = []
    for m in rows.modules:
        seen, w = set(), 0
        for mod in m.modules():
            if isinstance(mod, nn.Embedding):
                continue
            for p in mod.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    w += p.numel()
        out.append(float(w + 1))
    return out
