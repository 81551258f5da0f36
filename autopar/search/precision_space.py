"""Which matmul precisions the search lists for a GPU and a runtime (the ``precision`` plan field).

``bf16`` always; ``fp8`` (per-tensor scaling) where the GPU profile has an FP8 peak and the
runtime's stack has an FP8 recipe (``costmodels.model.precision.STACKS``). ``fp8-rowwise`` and
``mxfp8`` are searched only when ``--fix precision=...`` pins them: the cost model prices MXFP8 at
the FP8 rate (the same tensor-core peak) without FP8's all-gather, and rowwise scaling with more
cast work, so neither is ever faster than ``fp8`` there and listing them would only multiply the
search's configurations. A GPU without FP8 (A100, a CPU) lists ``bf16`` alone, so its searches
cost what they did.
"""
from __future__ import annotations

from types import SimpleNamespace

from costmodels.model.precision import PEAK_KEY, STACKS, check_plan_precision, stack_key
from costmodels.profiles.runtime import load_runtime


def search_precisions(profile, fix: dict | None) -> tuple[str, ...]:
    fix = fix or {}
    key = stack_key(load_runtime(fix.get("runtime")))
    if "precision" in fix:   # a pinned FP8 the GPU or the stack cannot run: one line, at once
        check_plan_precision(SimpleNamespace(precision=fix["precision"]), profile, key, "bf16-mixed")
        return (fix["precision"],)
    stack = STACKS.get(key)
    if stack is not None and "fp8" in stack.precisions and PEAK_KEY["fp8"] in profile.peak_flops:
        return ("bf16", "fp8")
    return ("bf16",)
