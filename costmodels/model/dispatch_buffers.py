"""The dispatched tokens a Mixture-of-Experts layer keeps for its backward, beyond the layer table.

Per MoE row and micro-batch, ``V = dispatch_bytes·k/tp`` is one GPU's routed tokens
(``routed_tokens·hidden·dtype``, costmodels.model.experts). What autograd keeps of them, per
stack (each count read from the code; the runtime profile's ``[moe] saved_token_copies``):

* the experts' first GEMM keeps its input, the tokens the rank received (``V`` at balanced
  routing): the layer table counts it (``moe_tables``: ``2·routed·(h + 3·f_e)``, the ``h`` part;
  a traced table, the experts' own input). Never charged here again;
* the all-to-alls keep nothing (their backward is the reverse all-to-all), nor do the
  permutations (an index map);
* what multiplies the tokens by the routing weights keeps a routed·hidden tensor when it runs on
  the tokens (``saved_token_copies`` = 1): Megatron-core up to core_v0.12.0's unpermute with the
  probs (the megatron profile's ``unpermute_probs`` option), torchtitan's score multiply (before
  or after the experts), autopar's combine (``out * weights``). Where the weights go into the
  experts' activation instead (Megatron-core from the core_r0.12.0 MoE cherry-pick / core_v0.13.0,
  NeMo AutoModel's DeepEP experts) nothing more is kept (0).

The earlier charge, ``2·ι·V`` on top of the table's copy, counted the dispatch and combine
receive buffers as kept; they are not (the combine's output is summed into the block output,
the dispatch's is the experts' input already counted). ``ι`` (the load imbalance) scales the
busiest rank's copy as it scales its all-to-alls.

Without full recompute the copies are kept per micro-batch in flight (``buffer_bytes``); under
full recompute a block keeps only its input, so they exist for the block being recomputed only
(``work_buffer_bytes``, the recompute working set).
"""
from __future__ import annotations

import numpy as np


def dispatch_buffer_bytes(v: np.ndarray, moe: np.ndarray, imbalance: float, saved_copies: int,
                          recompute: str) -> tuple[np.ndarray, np.ndarray]:
    """(kept per micro-batch in flight, kept while the block runs) per row (module docstring)."""
    held = np.where(moe, float(saved_copies) * imbalance * v, 0.0)
    return held * (recompute != "full"), held
