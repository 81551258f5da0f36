"""The tp all-gather of a MoE layer's tokens in a runtime that splits them without sequence parallel.

``costmodels.model.experts`` prices the experts of a tp rank on ``1/tp`` of the tokens
(``V = dispatch_bytes/tp``), as Megatron-core runs them: it requires sequence parallelism with tp
under MoE (megatron/training/arguments.py: "When using MoE and tensor parallelism, sequence
parallelism must be used"), so each tp rank already holds its ``S/tp`` slice of the sequence and
its ``MoEAlltoAllTokenDispatcher`` dispatches that (its notation: num_local_tokens = S/TP·B), no
gather of the tokens over tp at etp 1.
autopar's runtime runs tp without sequence parallel on MoE rows too (``autopar/rewrite/
experts.py``): the tokens at the routed experts are then replicated over tp, each tp rank keeps its
``tensor_split`` of them (free), routes and exchanges only those, and the experts' outputs are
all-gathered over tp to give every rank the whole replicated result (``TokenGather``); the
backward of the split all-gathers the input tokens' gradient (``TokenSplit``). So per MoE layer
and direction one all-gather over tp of the layer's tokens, ``b·s·h`` in the activation dtype —
the row's ``tp_comm_bytes`` — which is what a runtime profile's ``[moe] tp_token_gather = 1``
says it runs. Under full recompute the forward's gather runs again. Added to the row's tp
collectives (``RowTimes.tp_*``), so the runtime's tp overlap treats it as the other tp traffic.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodels.model.comm import collective_time
from costmodels.model.compute import RowTimes
from costmodels.model.experts import expert_arrays
from costmodels.model.table_arrays import TableArrays


def with_token_gather(rt: RowTimes, arr: TableArrays, tier, plan, runtime) -> RowTimes:
    """``rt`` with the tp all-gathers of the MoE rows' tokens (module docstring) where the runtime
    splits them without sequence parallel; ``rt`` unchanged otherwise."""
    if not getattr(runtime, "moe_tp_token_gather", 0) or plan.tp == 1 or plan.sequence_parallel:
        return rt
    moe = expert_arrays(arr).experts > 0
    if not moe.any():
        return rt
    k = plan.micro_batch_size / arr.table.micro_batch
    nbytes = np.where(moe, arr.tp_comm_bytes * k, 0.0)
    one_b, one_s = collective_time("all_gather", nbytes, plan.tp, tier)
    one_s = np.where(nbytes > 0, one_s, 0.0)
    one_b = np.where(nbytes > 0, one_b, 0.0)
    full = plan.recompute == "full"
    return replace(rt, tp_fwd_s=rt.tp_fwd_s + one_s, tp_bwd_s=rt.tp_bwd_s + one_s,
                   tp_bytes_fwd=rt.tp_bytes_fwd + one_b, tp_bytes_bwd=rt.tp_bytes_bwd + one_b,
                   tp_recompute_s=rt.tp_recompute_s + (one_s if full else 0.0),
                   tp_bytes_recompute=rt.tp_bytes_recompute + (one_b if full else 0.0))
