"""Megatron's ``overlap_p2p_comm``: the interleaved pipeline's activation and gradient sends
run beside the compute of the chunk before the one that needs them.

With interleaving, Megatron-core's ``forward_backward_pipelining_with_interleaving`` under
``overlap_p2p_comm`` posts each chunk's receive (and its output's send) asynchronously before
the compute of the current chunk and waits for it only when the next chunk starts
(``p2p_communication`` with ``overlap_p2p_comm=True``, ``batch_p2p_comm=False``; the
``fwd_wait_handles`` / ``bwd_wait_handles`` of megatron/core/pipeline_parallel/schedules.py), so
a send hides behind a whole chunk's forward or backward, far longer than one activation's
transfer for any block-sized chunk. Who switches it on:

* NeMo 2 (every run of NeMo's performance scripts and llm recipes): ``MegatronCommOverlapCallback``
  sets ``overlap_p2p_comm = True, batch_p2p_comm = False`` whenever ``pp > 1`` and ``vpp > 1``
  (nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py, ``_get_model_comm_overlap_cfgs``,
  "PP overlap");
* NeMo 1 launcher yamls only where they say ``overlap_p2p_comm: true`` (its default is false).

A hidden send still costs what any hidden collective costs the compute beside it, the GPU's
``collective_slowdown`` ``s`` (coefficients), so the exposed p2p time of a cut is
``s · p2p`` instead of ``p2p``: linear in the cut's send, as the search's program needs. Without
interleaving Megatron's 1F1B batches its sends (``batch_p2p_comm``), exposed as before. The
runtime profile says so with ``[overlap] pp_p2p_overlap = 1`` (``megatron:overlap_p2p_comm``).
"""
from __future__ import annotations


def p2p_exposed_share(plan, runtime, slowdown: float) -> float:
    """The share of each pipeline send left on the critical path (module docstring)."""
    if (getattr(runtime, "pp_p2p_overlap", 0) and getattr(plan, "schedule", "") == "interleaved-1f1b"
            and getattr(plan, "vpp", 1) > 1 and getattr(plan, "pp", 1) > 1):
        return slowdown
    return 1.0
