"""Communication model: alpha-beta time of each collective on the link tier its group crosses.

For a buffer of ``S`` bytes (the whole tensor, as nccl-tests define it) over ``n`` GPUs on a
tier with per-GPU bandwidth ``β`` (bytes/s, one direction, achievable bus bandwidth) and per-step
latency ``α`` (a profile measured by ``autopar profile`` may give each collective its own α-β
inside a node, ``LinkTier.alpha_beta``: gloo's all-gather and reduce-scatter are much slower per
byte than its all-reduce; and its times measured *in a step*, between compute, which
``curve_time`` interpolates in place of the line for a group of the size measured)::

    all_reduce (ring)   bytes/GPU = 2(n-1)/n · S     time = 2(n-1)·α + bytes/β   (across nodes
                        NCCL's tree where fewer steps: 2⌈log2 n⌉·α, collectives_at_scale.py)
    all_gather          bytes/GPU =  (n-1)/n · S     time =  (n-1)·α + bytes/β
    reduce_scatter      bytes/GPU =  (n-1)/n · S     time =  (n-1)·α + bytes/β
    p2p (send)          bytes/GPU =  S               time =        α + S/β
    n == 1: nothing moves, time 0.

Which tier a group crosses (``group_tier``): ranks are laid out by the plan's ``placement``,
innermost dimension first (default ``tp,dp,pp``: rank = tp_i + tp·(dp_i + dp·pp_i)). A
dimension with ``stride`` (product of the sizes of the dimensions inside it) and ``size`` spans
``stride·size`` consecutive ranks; it stays inside a node when that span is at most
``gpus_per_node`` (nodes hold consecutive ranks), else it crosses the inter-node network. A
profile that gives ``[inter_node] nics_per_node`` (the GPU profiles) prices a group that spans
nodes as NCCL's two-level algorithms do (``two_level``: NVLink inside each node, the group's
share of the node's NICs between nodes, the slowest bounding the whole, per-hop latency on each
tier), with a contention term when groups of other dimensions cross the same NICs at the same
time (``HardwareProfile.group_link``); a profile without it runs the ring at the per-GPU network
bandwidth, as before.

What each parallel dimension sends (per GPU, per step; m micro-batches, P_r parameters on this
GPU after tp/pp sharding, 2-byte grads and weights):

* TP: see compute (per row and micro-batch; all-reduce, or AG + RS with sequence parallel).
* PP: each virtual stage sends its output activation forward and its input gradient backward,
  once per micro-batch: p2p of ``boundary_bytes·k / t`` (Megatron's scatter/gather optimisation
  sends 1/t of the tensor; the all-gather on NVLink that restores it is neglected).
* DP (gradient sync, once per step after the last micro-batch): ZeRO 0: all-reduce of 2·P_r;
  ZeRO 1/2: reduce-scatter of the grads + all-gather of the updated bf16 weights (same bytes as
  the all-reduce); ZeRO 3: reduce-scatter of the grads only. Overlapped with the backward of
  the last micro-batch: exposed = max(0, t_dp − ov · bwd time of one micro-batch on this
  stage), ``ov`` = the profile's ``comm_overlap`` (1 by default: NCCL on its own streams; a
  CPU host running gloo beside one compute thread per core measures 0.2–0.5), for ZeRO-2/3
  its ``fsdp_overlap`` (``HardwareProfile.overlap``): FSDP2 prefetches and reduces on device
  streams, so on a CPU, which has none, its collectives run in line (``autopar profile``
  writes 0 there).
* autopar's own runtime (estimate's ``precision`` "amp" / "fp32") runs ZeRO-1 as DDP's
  all-reduce (overlapped as above) and then, after the optimizer step, one broadcast per dp
  owner of the weights it updated, never hidden (``estimate.zero1_broadcast``).
* The gradient sync is priced on the α-β line even where a profile has measured in-step
  points (``collective_time(line=True)``): its size is a stage's parameter count, which the
  search's integer program keeps linear.
* ZeRO-2/3 run on FSDP2: their gradient reduce-scatter and weight all-gathers are the
  ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` kinds (``TENSOR_KINDS``).
* ZeRO-3 parameter gathers: every micro-batch, each row's (layer's) weights are all-gathered
  before its forward and again before its backward (2·P_row bytes each, one collective per
  row, so the latency term counts once per row); prefetched behind compute, so per virtual stage
  and pass only max(0, Σ_rows t_gather − ov · compute time of that pass) is exposed.
"""
from __future__ import annotations

import numpy as np

from costmodels.model.collectives_at_scale import all_reduce_steps
from costmodels.profiles.topology import (  # noqa: F401  (re-exported: the model reads them from comm)
    COLLECTIVES,
    MEASURED_KINDS,
    TENSOR_KINDS,
    group_span,
    group_tier,
    plan_tiers,
    two_level,
)


def base_kind(kind: str) -> str:
    return TENSOR_KINDS.get(kind, kind)


def collective_bytes(kind: str, nbytes, n: int):
    """Bytes each GPU sends for a collective over a whole buffer of ``nbytes`` on ``n`` GPUs."""
    kind = base_kind(kind)
    if n <= 1:
        return nbytes * 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * nbytes
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * nbytes
    if kind == "p2p":
        return nbytes * 1.0
    raise ValueError(f"unknown collective {kind!r}; one of {COLLECTIVES}")


def collective_steps(kind: str, n: int) -> int:
    kind = base_kind(kind)
    if n <= 1:
        return 0
    return {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1, "p2p": 1}[kind]


def collective_latency(kind: str, n: int, tier) -> float:
    """The α part of a collective's line, ``steps·α`` (the same for every buffer size): the
    fixed term the search's integer program keeps apart from the per-byte one."""
    if base_kind(kind) == "all_reduce":   # NCCL's tree across nodes (collectives_at_scale.py)
        return all_reduce_steps(n, tier) * tier.alpha_beta(kind)[0]
    return collective_steps(kind, n) * tier.alpha_beta(kind)[0]


def collective_time(kind: str, nbytes, n: int, tier, line: bool = False):
    """(bytes sent per GPU, seconds) for one collective; ``nbytes`` may be a numpy array.
    ``tier`` is a ``hardware.LinkTier``. A zero-byte buffer costs 0 (nothing is launched).
    Where the tier has measured in-step points of ``kind`` over ``n`` ranks (``LinkTier.curve``)
    they are interpolated (``curve_time``), unless ``line``: the α-β line, which the gradient
    sync uses so that its time stays linear in the parameters a split puts on a stage."""
    b = collective_bytes(kind, nbytes, n)
    beta = tier.alpha_beta(kind)[1]
    curve = None if line or n <= 1 else tier.curve(kind, n)
    t = collective_latency(kind, n, tier) + b / beta if curve is None else curve_time(curve, nbytes)
    if isinstance(nbytes, np.ndarray):
        t = np.where(nbytes > 0, t, 0.0)
    elif nbytes <= 0:
        t = 0.0
    return b, t


def curve_time(curve: tuple[tuple, tuple], nbytes):
    """Seconds of a collective of ``nbytes`` read off measured (bytes, seconds) points: linear
    between the points (made non-decreasing: a larger buffer never costs less; noise can say
    otherwise), the smallest point's time below them (latency-bound), and beyond the largest
    the last segment's slope (per-byte cost rises out of cache: the α-β line, one slope for all
    sizes, missed a 32 MiB gloo all-gather by 40 %)."""
    xs = np.asarray(curve[0], dtype=float)
    ys = np.maximum.accumulate(np.asarray(curve[1], dtype=float))
    s = np.asarray(nbytes, dtype=float)
    t = np.interp(s, xs, ys)
    if xs.size > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        t = np.where(s > xs[-1], ys[-1] + (s - xs[-1]) * slope, t)
    return t if isinstance(nbytes, np.ndarray) else float(t)
