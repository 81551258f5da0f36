"""An unfused (eager) RMSNorm: the HBM bytes its separate kernels move beyond one fused kernel's.

The element-wise term of ``costmodels.model.compute`` (``C_FWD`` bytes per saved-activation
byte) was fitted on stacks whose norms are one kernel each: Megatron-LM's fused LayerNorm
(Korthikanti Table 5), Composer's low-precision LayerNorm (MPT), Transformer Engine's fused
LayerNorm-GEMM; torchtitan's Triton ``fused_rmsnorm`` and inductor's fused norm under
``torch.compile`` are one kernel too. torchtitan's plain ``norm_type = "rmsnorm"`` without compile
is not: ``_norm(x.float()).type_as(x) * weight`` runs as eight aten kernels, each reading and
writing whole tensors (two of them fp32 copies), and its autograd backward as sixteen. A runtime
names those bytes per normalised element beyond the fused kernel's (``[kernels]
unfused_norm_fwd_bytes_per_element`` / ``unfused_norm_bwd_bytes_per_element``, counted by
``benchmarks/measure_eager_rmsnorm_bytes.py``: 32 and 90 in bf16; fsdp.toml
``[options.eager_rmsnorm]``), and each row pays them at the element-wise bandwidth::

    extra_fwd_i = n_i · (b·s / (cp · (tp if sp else 1))) · h · fwd_bytes / W     (bwd likewise)

``n_i`` = the row's norms: a block row's whole-under-TP parameter vectors
(``tp_replicated_tensors``), which for the bias-free Llama blocks torchtitan runs are exactly its
two RMSNorm weights; the head row's final norm (one, for a model with a vocabulary). A norm
normalises the tokens the rank holds: the whole sequence at tp without sequence parallel, its
shard with it, its cp shard. Full recompute runs the norms again (they precede every block's
last saved tensor, so the checkpoint's early stop does not skip them). Applied in
``coefficients.plan_row_times``, the one pipeline ``estimate`` and the search's coefficients read,
so the search's objective stays ``estimate``'s step time; the pooled bound (``search.pools``),
which leaves it out, stays below it.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np


def norms_per_row(arr) -> np.ndarray:
    """Norms each row runs per token (module docstring: ``n_i``)."""
    t = arr.table
    head = np.array([1.0 if (r.kind == "head" and t.vocab) else 0.0 for r in t.rows])
    return np.where(arr.is_block, arr.tp_replicated, head)


def unfused_norm_times(rt, arr, kernels, plan, runtime):
    """``rt`` with each row's unfused-norm seconds added (module docstring); ``rt`` itself for a
    runtime without the figures or a table without a hidden size."""
    fwd_b = float(getattr(runtime, "unfused_norm_fwd_bytes", 0.0) or 0.0)
    bwd_b = float(getattr(runtime, "unfused_norm_bwd_bytes", 0.0) or 0.0)
    t = arr.table
    if not (fwd_b or bwd_b) or not t.hidden:
        return rt
    tokens = plan.micro_batch_size * t.seq / (getattr(plan, "cp", 1) * (plan.tp if plan.sequence_parallel else 1))
    elems = norms_per_row(arr) * tokens * t.hidden
    w = kernels.elementwise_bw
    fwd = elems * fwd_b / w
    rec = np.where((rt.recompute_s > 0) & arr.is_block, fwd, 0.0) if plan.recompute == "full" else 0.0
    return replace(rt, fwd_s=rt.fwd_s + fwd, bwd_s=rt.bwd_s + elems * bwd_b / w, recompute_s=rt.recompute_s + rec)
