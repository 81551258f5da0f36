"""Collectives at scale: how many latency steps a collective pays over n ranks, and how many
collectives a runtime issues per layer.

* Ring all-gather and reduce-scatter pay ``(n − 1)`` steps of α (``comm.collective_steps``): NCCL
  has no tree for them, so their fixed cost grows linearly with the group, and at hundreds to
  thousands of ranks a ZeRO-3 gather of one layer costs milliseconds before a byte of it is
  useful.
* All-reduce across nodes: NCCL picks a double binary tree where it is faster (NCCL 2.4+,
  ``NCCL_ALGO`` Tree; Sanders et al. 2009 trees, NVIDIA's "Massively Scale Your Deep Learning
  Training with NCCL 2.4", 2019): a reduce up and a broadcast down a tree, ``2·⌈log2 n⌉`` steps
  where the ring takes ``2·(n − 1)``, at about the ring's bus bandwidth for large messages. So an
  all-reduce across the nodes of a GPU profile (its two-level tier) pays ``min(2(n − 1),
  2⌈log2 n⌉)`` steps. Inside one node (NVSwitch) and on CPU hosts (gloo) the ring is kept.
* A runtime issues ZeRO collectives per *module*, not per layer-table row: DeepSpeed's ZeRO-3
  all-gathers each submodule's parameters when it is about to run (one coalesced all-gather per
  ``nn.Module`` with parameters: partitioned_param_coordinator.fetch_sub_module), FSDP one per
  wrapped unit (a block). ``[communication] zero_collectives_per_row`` in the runtime profile
  (default 1) is that count per block; each collective pays its own ``(n − 1)·α``.
"""
from __future__ import annotations

import math

import numpy as np


def all_reduce_steps(n: int, tier) -> int:
    """Latency steps of an all-reduce over ``n`` ranks on ``tier``: the tree's where NCCL would
    pick it (a group across the nodes of a GPU profile that prices NCCL's two levels,
    ``LinkTier.nccl_tree``; where it is fewer), else the ring's ``2(n − 1)`` (gloo on a CPU host,
    a node's NVSwitch)."""
    ring = 2 * (n - 1)
    if n <= 2 or not getattr(tier, "nccl_tree", False):
        return ring
    return min(ring, 2 * math.ceil(math.log2(n)))


def extra_collectives_s(latency_s: float, per_row: float, is_block: np.ndarray,
                        has_bytes: np.ndarray) -> np.ndarray:
    """Seconds per row of the collectives a runtime issues beyond the first, per pass: each
    pays ``latency_s`` (its ``steps·α``); block rows with bytes to move only."""
    extra = max(0.0, float(per_row) - 1.0)
    if not extra or not latency_s:
        return np.zeros(len(is_block))
    return np.where(is_block & has_bytes, extra * latency_s, 0.0)
