"""Hardware profiles: what the cost model knows about a GPU, a node and the network.

A profile is a TOML file in ``hardware-profiles/`` (package data, so an installed
autopar finds the shipped ones wherever it runs) or anywhere on disk (``--hardware
path/to/file.toml``). ``load_profile`` takes a name (``a100-80g-sxm``) or a path;
``list_profiles`` lists the shipped ones.

Format (version 1). Units are in the field names. Every *figure* is an inline table
``{ value = <number>, source = "<where it comes from>" }`` so that each number carries its
citation; a figure without a ``source`` string is an error. ``parse_profile`` reads this format
and ``costmodels.profiles.profile_format.dump_profile`` writes it (what ``autopar profile`` writes its
measured profiles with: ``source = "measured by autopar profile on <host>, <date>"``).

```toml
version = 1
name = "a100-80g-sxm"                  # what --hardware and plans files call it
description = "NVIDIA A100-SXM4-80GB in an 8-GPU HGX/DGX node, HDR InfiniBand"

[gpu]
model = "NVIDIA A100-SXM4-80GB"
peak_bf16_flops_per_s = { value = 312e12, source = "..." }   # dense, not 2:4-sparse
peak_fp16_flops_per_s = { value = 312e12, source = "..." }   # optional (default: bf16)
peak_tf32_flops_per_s = { value = 156e12, source = "..." }   # optional
peak_fp32_flops_per_s = { value = 19.5e12, source = "..." }
hbm_bytes = { value = 80e9, source = "..." }
hbm_bandwidth_bytes_per_s = { value = 2.039e12, source = "..." }
memory_reserve_bytes = { value = 3e9, source = "..." }       # CUDA context, NCCL, fragmentation

[gpu.matmul_efficiency]        # achievable fraction of peak for ONE matmul of `flops` FLOPs
flops = [1e8, 1e10, 1e12]      # (2·m·n·k on one GPU), increasing; log-linear interpolation,
efficiency = [0.1, 0.45, 0.7]  # clamped at both ends; each in (0, 1]
source = "..."

[node]
gpus_per_node = { value = 8, source = "..." }

[intra_node]                   # link tier inside a node (NVLink / NVSwitch)
bandwidth_bytes_per_s = { value = 230e9, source = "..." }   # achievable per GPU, one direction
latency_s = { value = 5e-6, source = "..." }                  # per collective step (alpha)

[inter_node]                   # link tier between nodes (per-GPU NIC share)
bandwidth_bytes_per_s = { value = 23e9, source = "..." }
latency_s = { value = 1e-5, source = "..." }
nics_per_node = { value = 8, source = "..." }   # optional: NCCL's two-level pricing of groups
                                 # across nodes (costmodels.profiles.topology.two_level); without it the ring
                                 # runs at the per-GPU share
```

Optional, written by ``autopar profile`` (measured on the user's machine); a profile without
them behaves exactly as before (the defaults below):

```toml
[gpu]
elementwise_bandwidth_bytes_per_s = { value = ..., source = "..." }  # non-matmul kernels
                                 # (layer norm, GeLU, softmax, adds, casts); default hbm bandwidth
optimizer_bandwidth_bytes_per_s = { value = ..., source = "..." }    # the optimizer step per
                                 # OPTIMIZER_BYTES_PER_PARAM bytes per parameter; default hbm bandwidth
attention_efficiency = { value = ..., source = "..." }  # fused attention core, fraction of peak;
                                 # default: the row's matmul efficiency
comm_overlap = { value = ..., source = "..." }  # fraction of dp / ZeRO communication that runs
                                 # hidden behind compute (0..1); default 1 (separate NCCL streams)
fsdp_overlap = { value = ..., source = "..." }  # the same for ZeRO-2/3 (FSDP2, which overlaps
                                 # only on device streams: 0 on a CPU); default comm_overlap
collective_slowdown = { value = ..., source = "..." }  # step time lost per second of dp / ZeRO
                                 # collective run hidden beside compute (NCCL kernels share the SMs
                                 # and HBM); default: the runtime profile's compute_slowdown

[gpu.cross_entropy]              # the token loss, forward + backward, by logits per call
logits = [...]                   # (increasing; log-linear interpolation, clamped); default:
logits_per_s = [...]             # LOSS_BYTES_PER_LOGIT bytes per logit at element-wise bandwidth
source = "..."

[collectives.all_reduce]         # (all_gather, reduce_scatter, p2p, all_gather_into_tensor,
                                 # reduce_scatter_tensor): measured per collective;
alpha_s = ...                    # inside a node these replace the tier's one alpha-beta
beta_bytes_per_s = ...
source = "..."
in_step_alpha_s = ...            # optional: the same collective timed between compute, as a
in_step_beta_bytes_per_s = ...   # step issues it; where present the cost model uses these
in_step_source = "..."
ranks = 2                        # with the points measured in-step over that many ranks, which
in_step_bytes = [...]            # the cost model interpolates (comm.collective_time) for
in_step_seconds = [...]          # groups of that size
```

Numbers are floats or integers (``80e9``, ``85_899_345_920``). A malformed profile raises
``ProfileError`` naming the file and the field, e.g. ``gpu.hbm_bytes.value``: a field the format
does not know (with the nearest known name), and a figure outside its plausible range
(``costmodels/profiles/profile_checks.py``, ``RANGES``: peaks 1e9..1e17 FLOP/s, HBM 1e9..1e13 bytes, memory
bandwidth 1e9..1e14 B/s, link bandwidth 1e6..1e13 B/s, latencies 0..1 s; a figure in the wrong
unit, such as 312 for 312 TFLOP/s, falls outside it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from costmodels.profiles.topology import TENSOR_KINDS, group_span, group_tier, two_level


@dataclass(frozen=True)
class LinkTier:
    """One link tier: alpha-beta model of a collective step."""

    name: str                       # "intra_node" | "inter_node"
    bandwidth_bytes_per_s: float    # achievable per GPU, one direction (bus bandwidth)
    latency_s: float                # alpha, per ring step
    collectives: tuple[tuple[str, float, float], ...] = ()  # (kind, alpha_s, beta) measured
    curves: tuple[tuple[str, int, tuple, tuple], ...] = ()  # (kind, ranks, bytes, seconds) in-step
    nccl_tree: bool = False         # NCCL across nodes: all-reduce may take its tree (collectives_at_scale)

    def alpha_beta(self, kind: str) -> tuple[float, float]:
        """(alpha per step, bus bandwidth) for ``kind``: its own measured fit when the profile
        has one for this tier, else the tier's."""
        own = {k: (a, b) for k, a, b in self.collectives}
        for k in (kind, TENSOR_KINDS.get(kind)):
            if k in own:
                return own[k]
        return self.latency_s, self.bandwidth_bytes_per_s

    def curve(self, kind: str, n: int) -> tuple[tuple, tuple] | None:
        """The measured in-step (bytes, seconds) points of ``kind`` itself over ``n`` ranks, if
        any (no fallback to a base kind: its α-β may be the kind's own)."""
        for k, r, x, y in self.curves:
            if k == kind and r == n:
                return x, y
        return None


@dataclass(frozen=True, eq=False)
class HardwareProfile:
    name: str
    description: str
    gpu_model: str
    peak_flops: dict[str, float]    # dtype -> dense peak FLOP/s ("bf16", "fp16", "tf32", "fp32")
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    memory_reserve_bytes: float
    eff_flops: tuple[float, ...]    # matmul-efficiency curve: sizes (FLOPs of one matmul)
    eff_values: tuple[float, ...]   # and achievable fraction of peak at each size
    gpus_per_node: int
    intra_node: LinkTier
    inter_node: LinkTier
    path: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    elementwise_bandwidth_bytes_per_s: float | None = None   # None: hbm bandwidth
    optimizer_bandwidth_bytes_per_s: float | None = None     # None: hbm bandwidth
    attention_efficiency: float | None = None                # None: the row's matmul efficiency
    attention_bwd_ratio: float | None = None                 # None: compute.FLASH_BWD_RATIO
    ce_logits: tuple[float, ...] = ()                        # cross-entropy curve (may be empty:
    ce_rates: tuple[float, ...] = ()                         # bytes at element-wise bandwidth)
    comm_overlap: float = 1.0
    fsdp_overlap: float | None = None    # ZeRO-2/3 (FSDP2) comm hidden; None: comm_overlap
    collective_slowdown: float | None = None   # None: the runtime profile's compute_slowdown
    nics_per_node: int | None = None     # None: a group across nodes runs at the per-GPU NIC share
    # FP8 (costmodels.model.precision): peak_flops may hold "fp8" / "mxfp8" (absent: the GPU has
    # none); the fitted FP8 matmul efficiency scale per runtime (stack) name
    fp8_matmul_scale: tuple[tuple[str, float], ...] = ()
    nvlink_domain_gpus: int | None = None   # GPUs one NVLink domain joins; None: gpus_per_node

    @property
    def link_domain(self) -> int:
        """GPUs that reach each other over NVLink: the tier boundary of every group (an NVL72
        rack's 72, an HGX node's 8); ``gpus_per_node`` stays the host's GPUs (launch, nodes)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    def group_link(self, plan, dim: str) -> LinkTier:
        """The link tier the ``dim`` group ('tp', 'dp', 'pp') of ``plan`` runs its collectives on:
        its tier, or with ``nics_per_node`` and a group across nodes the two-level figures of
        ``comm.two_level``. Contention: tensor parallelism across nodes shares the NICs with dp
        (and ZeRO) traffic, and ZeRO-3's continuous gathers with the pipeline's sends; the dp sync
        and p2p alone are taken not to contend (short bursts)."""
        return _group_link(self, plan.placement, plan.tp, plan.dp, plan.pp, plan.zero, dim)

    def overlap(self, zero: int) -> float:
        """Share of the dp / ZeRO communication compute can hide for a plan with this ZeRO
        stage: ZeRO-2/3 run on FSDP2, which hides its collectives only on device streams."""
        return self.fsdp_overlap if zero >= 2 and self.fsdp_overlap is not None else self.comm_overlap

    def cross_entropy_logits_per_s(self, logits):
        """Measured loss rate for calls of ``logits`` logits (log-linear, clamped); None when
        the profile has no [gpu.cross_entropy] curve."""
        if not self.ce_logits:
            return None
        x = np.log10(np.maximum(np.asarray(logits, dtype=float), 1.0))
        return np.interp(x, np.log10(self.ce_logits), self.ce_rates)

    @property
    def elementwise_bw(self) -> float:
        return self.elementwise_bandwidth_bytes_per_s or self.hbm_bandwidth_bytes_per_s

    @property
    def optimizer_bw(self) -> float:
        return self.optimizer_bandwidth_bytes_per_s or self.hbm_bandwidth_bytes_per_s

    def peak_flops_per_s(self, dtype_bytes: int = 2) -> float:
        """Dense peak for the activation dtype: 2 bytes -> bf16, 4 -> fp32 (tf32 not assumed)."""
        return self.peak_flops["bf16"] if dtype_bytes <= 2 else self.peak_flops["fp32"]

    def matmul_efficiency(self, flops):
        """Achievable fraction of peak for matmuls of ``flops`` FLOPs each (scalar or array):
        linear interpolation in log10(flops), clamped to the curve's end values."""
        x = np.log10(np.maximum(np.asarray(flops, dtype=float), 1.0))
        return np.interp(x, self._logf, self._effv)

    def tier(self, name: str) -> LinkTier:
        return self.intra_node if name == "intra_node" else self.inter_node

    def __post_init__(self):
        object.__setattr__(self, "_logf", np.log10(np.asarray(self.eff_flops, dtype=float)))
        object.__setattr__(self, "_effv", np.asarray(self.eff_values, dtype=float))

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "gpu": self.gpu_model, "peak_bf16_flops_per_s": self.peak_flops["bf16"],
                "hbm_bytes": self.hbm_bytes, "hbm_bandwidth_bytes_per_s": self.hbm_bandwidth_bytes_per_s,
                "gpus_per_node": self.gpus_per_node,
                "intra_node_bandwidth_bytes_per_s": self.intra_node.bandwidth_bytes_per_s,
                "inter_node_bandwidth_bytes_per_s": self.inter_node.bandwidth_bytes_per_s,
                "memory_reserve_bytes": self.memory_reserve_bytes, "path": self.path,
                "description": self.description}


@lru_cache(maxsize=4096)
def _group_link(profile: HardwareProfile, placement: str, tp: int, dp: int, pp: int, zero: int,
                dim: str) -> LinkTier:
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    domain = profile.link_domain
    name = group_tier(placement, sizes, dim, domain)
    if name == "intra_node" or profile.nics_per_node is None or sizes[dim] < 2:
        return profile.tier(name)
    crosses = {d: group_tier(placement, sizes, d, domain) == "inter_node" and sizes[d] > 1
               for d in sizes}
    contention = 1 + {"tp": crosses["dp"] and zero == 3, "dp": crosses["tp"],
                      "pp": crosses["tp"] or (crosses["dp"] and zero == 3)}[dim]
    inter = profile.inter_node
    if dim == "pp":   # point to point: each GPU sends its own slice on its own NIC, one hop
        return LinkTier("inter_node", inter.bandwidth_bytes_per_s / contention, inter.latency_s)
    per_node, _ = group_span(placement, sizes, dim, domain)
    # the NICs of the whole NVLink domain (its hosts' NICs; one host when the domain is the node)
    per_node = min(per_node, profile.nics_per_node * max(1, domain // profile.gpus_per_node))
    alpha, beta = two_level(sizes[dim], per_node, profile.intra_node, profile.inter_node, int(contention))
    return LinkTier("inter_node", beta, alpha, nccl_tree=True)
