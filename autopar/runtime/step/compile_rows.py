"""``autopar.apply(..., compile=True)``: each row of this rank compiled on its own, as torchtitan
compiles each TransformerBlock (``torchtitan/models/llama3/infra/parallelize.py: apply_compile``).

Why per row and in place (``nn.Module.compile``): the module objects stay the ones the rest of
the runtime knows — their parameter names (checkpoints, clipping, tied weights), their FSDP2 hooks
(dynamo leaves them out of the graph: ``torch._dynamo.config.skip_fsdp_hooks``), their place in a
PipelineStage — and the rows of a model repeat, so dynamo compiles one block and reuses its code
for the others (``inline_inbuilt_nn_modules``: parameters are graph inputs, not constants). A whole
stage compiled as one graph would recompile per stage and break at every collective of DDP.

On CPU inductor writes C++ and needs a C compiler (``cc``); without one ``check_compilable``
refuses in one line instead of failing in the first step.
"""
from __future__ import annotations

import shutil

import torch.nn as nn

from costmodels.contracts.errors import PlanError


def check_compilable(device_type: str) -> None:
    """One-line refusal when inductor cannot build kernels for ``device_type`` here."""
    if device_type == "cpu" and shutil.which("cc") is None and shutil.which("gcc") is None \
            and shutil.which("clang") is None:
        raise PlanError("compile=True on CPU needs a C compiler (inductor's CPU backend writes "
                        "C++): install gcc (apt-get install build-essential) or run without "
                        "--compile")


def compile_rows(stages: list[nn.Module], device_type: str) -> int:
    """Compile every row of every local stage module in place; returns how many rows."""
    check_compilable(device_type)
    n = 0
    for stage in stages:
        for row in getattr(stage, "rows", [stage]):
            row.compile()
            n += 1
    return n
