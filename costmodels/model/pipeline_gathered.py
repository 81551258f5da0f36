"""ZeRO-3 under a pipeline as torchtitan runs it: every stage keeps its parameters gathered.

torchtitan wraps each block and each pipeline stage with FSDP2 ``fully_shard(...,
reshard_after_forward=...)`` whose policy ``parallelism.fsdp_reshard_after_forward`` defaults
to ``"default"``, read as ``reshard_after_forward = not pp_enabled`` (torchtitan 0.2.2,
torchtitan/models/llama3/infra/parallelize.py ``apply_fsdp``; the comment there: "For PP, do not
reshard after forward to avoid per-microbatch all-gathers"). With pp > 1 a block's weights,
gathered for the first micro-batch's forward, stay unsharded until its backward: at a 1F1B
stage's first backward every block of the stage (every chunk, interleaved) is held whole, not
the two rows ``memory.stage_memory`` charges for per-layer gathers. The runtime profile says
which it does (``[memory] zero3_stage_gathered_with_pp``, runtime-profiles/fsdp.toml: 1);
autopar's own runtime reshards under pp (autopar/runtime/step/data_parallel.py and
assemble/stages.py: ``reshard_after_forward=plan.zero == 3``): 0, the per-layer buffer.

The search's split program prices it the same way: the buffer becomes a per-row term (each
row's ``weight_bytes`` added to its ``state_bytes``, ``coefficients.row_coefficients``) instead
of the two-largest-rows buffer (``autopar.search.terms.Terms.zero3_buffer``).
"""
from __future__ import annotations

import numpy as np

from costmodels.profiles.runtime import load_runtime


def keeps_stage_gathered(plan, runtime=None) -> bool:
    """ZeRO-3 with pp > 1 on a runtime that does not reshard after forward under a pipeline."""
    if plan.zero < 3 or plan.pp <= 1:
        return False
    rt = load_runtime(runtime if runtime is not None else plan.runtime)
    return bool(getattr(rt, "zero3_stage_gathered_with_pp", 0))


def stage_gathered_memory(mem: dict, local_rows: np.ndarray, chunks, weight_bytes_per_param: float) -> dict:
    """``mem`` (a stage_memory breakdown) with ``gathered`` = every local row of the rank's
    ``chunks`` held whole (``local_rows``: each row's parameters on one GPU)."""
    held = weight_bytes_per_param * float(sum(local_rows[s:e].sum() for s, e in chunks))
    out = dict(mem)
    out["total"] = mem["total"] - mem["gathered"] + held
    out["gathered"] = held
    return out
