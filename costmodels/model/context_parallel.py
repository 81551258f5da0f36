"""Context parallelism (cp) and HSDP in the cost model: the per-rank share of a long sequence.

**cp as the per-rank share.** A cp plan cuts every sequence of ``S`` tokens into ``2·cp``
chunks, rank ``i`` of the cp group holding chunks ``i`` and ``2·cp − 1 − i`` (Megatron-core's
and torch's causal load balance). Every per-token quantity of a layer-table row — matmul FLOPs,
saved activations, the tensor-parallel collectives' bytes, the pipeline's boundary bytes, the
logits — is then ``1/cp`` of the whole sample's per GPU, and so is the causal attention core:
the rank's queries ``S/cp`` meet on average half of the ``S`` keys, ``4·b·S²·h/cp`` FLOPs, what
the load balance is for. So ``local_table(table, cp)`` is the table with every row's per-token
figures divided by cp (the sequence ``S/cp``, the attention core kept at ``S²/cp``: the field
``cp`` of ``CPLocalTable``, which ``table_arrays`` reads), and a cp plan is priced as the plan
``merged(plan)`` — ``dp·cp`` data-parallel ranks, ``cp = 1`` — on that table at a global batch
``cp`` times larger: the same micro-batches per step (``B·cp / (dp·cp·b)``), the same tokens
per step (``B·cp · S/cp``), the same model FLOPs, and exactly the right gradient sync and ZeRO
sharding, which Megatron-core (``data_parallel_group_with_cp``: the distributed optimizer and
the gradient all-reduce span dp·cp) and torchtitan (FSDP over the ``dp_shard_cp`` mesh) run over
dp·cp ranks. The cp ranks are the inner part of that merged group (``Plan.mesh_order``: cp right
outside tp), so its link tier is that of the real dp·cp group under the default placement; under
the other placements the merged group is taken as contiguous (an approximation, said here).

**Attention's communication** (``cp_row_times``, added to the block rows' forward and backward
of the local table, one micro-batch, per GPU; ``kv`` = the bytes of K and V of the rank's
``S/cp`` tokens, ``2·b·(S/cp)·kv_heads·(h/heads)·dtype / tp``):

* ``ring`` (Megatron-core ``--cp-comm-type p2p``, the default; torch ``_RotateMethod.ALL_TO_ALL``):
  cp − 1 steps, each sending its K/V block to the next rank while the attention runs on the
  block it holds; backward sends K/V and dK/dV (2·kv). Exposed per step:
  ``max(0, p2p(kv) − ov·t_step)``, ``t_step`` = the rank's attention-core time / cp.
* ``all_gather`` (torch's default ``_RotateMethod.ALL_GATHER``, torchtitan's
  ``context_parallel_rotate_method = "allgather"``; Megatron ``--cp-comm-type all_gather``):
  one all-gather of every rank's K/V (``kv·cp`` buffer) issued before the first, local block's
  attention and hidden behind it; backward the gather again and a reduce-scatter of dK/dV.
  Exposed: ``max(0, t_collectives − ov·t_step)``.
* the partial outputs' merge (online softmax): per extra step one read of the partial output,
  one read and one write of the fp32 accumulator (12 bytes per output element) at HBM
  bandwidth, forward and backward alike — bytes counted, not fitted.

Not counted: the ring's receive buffers (one or two K/V blocks per GPU, transient) and the fp32
accumulator of the merge; their bytes are a block's K/V and output, small beside a rank's saved
activations.

``ov`` (``RuntimeProfile.cp_overlap``): 1 where the transfer runs on its own stream (NCCL);
autopar's runtime on a CPU profile (gloo) runs its ring in line, 0. The variant is the runtime
profile's ``[context_parallel] all_gather_kv`` (0 ring, 1 all-gather).

**HSDP** (``dp_shard``): ZeRO's states and collectives span the shard group (``dp_shard``, or
``dp_shard·cp`` when merged), the ``dp / dp_shard`` replicas all-reduce the sharded gradients
once per step (``hsdp_sync``: reduce-scatter in the shard group, all-reduce of the 1/shard
across replicas, all-gather in the shard group for ZeRO-1/2), each group on its own link tier.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from costmodels.contracts.layer_table import LayerTable
from costmodels.model.comm import collective_latency, collective_time
from costmodels.profiles.hardware import LinkTier
from costmodels.profiles.topology import group_span, two_level

MERGE_BYTES_PER_ELEMENT = 12.0   # online-softmax merge: read partial (4), read + write accumulator (8)
_ROW_SCALED = ("fwd_flops", "bwd_flops", "saved_activation_bytes", "act_tp_bytes",
               "act_attention_core_bytes", "boundary_bytes", "tp_comm_bytes", "act_attention_mask_bytes",
               # a MoE row's routed tokens, their dispatch and the experts' FLOPs are the rank's too
               "expert_fwd_flops", "routed_tokens", "dispatch_bytes")


@dataclass(frozen=True)
class CPLocalTable(LayerTable):
    """The per-rank share of a table under cp (module docstring): ``seq`` is ``S/cp``; ``cp``
    keeps the attention core at ``S²/cp`` (``table_arrays``), ``full_seq`` the whole sample."""

    cp: int = 1
    full_seq: int = 0


def local_table(table: LayerTable, cp: int) -> LayerTable:
    """``table`` as one rank of a cp group sees it (module docstring); ``table`` itself at cp 1."""
    if cp <= 1:
        return table
    return _local_table(table, int(cp))


@lru_cache(maxsize=64)
def _local_table(table: LayerTable, cp: int) -> CPLocalTable:
    rows = []
    for r in table.rows:
        ch = {f: type(getattr(r, f))(getattr(r, f) / cp) for f in _ROW_SCALED}
        if r.bwd_weight_flops is not None:
            ch["bwd_weight_flops"] = r.bwd_weight_flops / cp
        ch["matmul_dims"] = tuple((max(1, m // cp), n, k) for m, n, k in r.matmul_dims)
        rows.append(replace(r, **ch))
    return CPLocalTable(model=table.model, micro_batch=table.micro_batch, seq=table.seq // cp,
                        hidden=table.hidden, heads=table.heads, kv_heads=table.kv_heads,
                        vocab=table.vocab, layers=table.layers, act_dtype_bytes=table.act_dtype_bytes,
                        rows=tuple(rows), cp=cp, full_seq=table.seq)


def merged(plan):
    """The plan priced on the local table: cp folded into dp (and into HSDP's shard group)."""
    if plan.cp <= 1:
        return plan
    shard = plan.dp_shard * plan.cp if plan.dp_shard else None
    return replace(plan, dp=plan.dp * plan.cp, cp=1, dp_shard=shard)


def link(profile, stride: int, size: int) -> LinkTier:
    """The link of a group of ``size`` ranks ``stride`` apart (ranks laid out innermost first,
    nodes holding consecutive ranks): a node's tier while ``stride·size`` fits a node, else the
    two-level ring of ``topology.two_level`` (no contention: the cp ring and the HSDP levels run
    apart from the other groups' collectives)."""
    gpn = profile.gpus_per_node
    if stride * size <= gpn or size < 2:
        return profile.intra_node
    if profile.nics_per_node is None:
        return profile.inter_node
    per_node, _ = group_span("a,b", {"a": stride, "b": size}, "b", gpn)
    alpha, beta = two_level(size, min(per_node, profile.nics_per_node), profile.intra_node,
                            profile.inter_node, 1)
    return LinkTier("inter_node", beta, alpha)


def cp_stride(plan) -> int:
    """Ranks between neighbours of the cp group: the product of the dimensions inside it."""
    stride = 1
    for d in plan.mesh_order():
        if d == "cp":
            return stride
        stride *= plan.mesh_sizes()[d]
    return stride


def cp_row_times(rt, arr, profile, tp: int, b: int, runtime, cp_tier: LinkTier | None = None):
    """``rt`` (compute.RowTimes of a ``CPLocalTable``) with attention's cp communication and the
    partial outputs' merge added to the block rows' forward and backward (module docstring);
    ``rt`` itself for any other table. ``cp_tier``: the cp group's link (None: inside a node)."""
    t = arr.table
    cp = getattr(t, "cp", 1)
    if cp <= 1:
        return rt
    fwd_extra, bwd_extra = cp_attention_s(arr, profile, tp, b, runtime, cp_tier)
    return replace(rt, fwd_s=rt.fwd_s + fwd_extra, bwd_s=rt.bwd_s + bwd_extra)


def kv_bytes(arr, tp: int, b: int) -> np.ndarray:
    """Per block row: K and V of the rank's S/cp tokens, per GPU of the tp group."""
    t = arr.table
    if not (t.hidden and t.heads):
        return np.zeros(arr.n)
    kv_width = (t.kv_heads or t.heads) * t.hidden / t.heads
    per = 2.0 * b * t.seq * kv_width * t.act_dtype_bytes / tp
    return np.where(arr.is_block & (arr.attn_core_flops > 0), per, 0.0)


def cp_attention_s(arr, profile, tp: int, b: int, runtime, cp_tier=None) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per block row of cp's exposed K/V traffic and the merge."""
    t = arr.table
    cp = t.cp
    tier = cp_tier or profile.intra_node
    k = b / t.micro_batch
    kv = kv_bytes(arr, tp, b)
    peak = profile.peak_flops_per_s(t.act_dtype_bytes)
    core = k * arr.attn_core_flops / tp
    eff = profile.attention_efficiency or profile.matmul_efficiency(np.maximum(core / cp, 1.0))
    t_step = np.where(core > 0, core / (peak * eff) / cp, 0.0)
    ov = cp_overlap(profile, runtime)
    if getattr(runtime, "cp_all_gather", 0):
        _, ag = collective_time("all_gather", kv * cp, cp, tier)
        _, rs = collective_time("reduce_scatter", kv * cp, cp, tier)
        fwd = np.maximum(0.0, ag - ov * t_step)
        bwd = np.maximum(0.0, ag + rs - ov * 2.5 * t_step)
    else:
        _, p1 = collective_time("p2p", kv, 2, tier)
        _, p2 = collective_time("p2p", 2.0 * kv, 2, tier)
        fwd = (cp - 1) * np.maximum(0.0, p1 - ov * t_step)
        bwd = (cp - 1) * np.maximum(0.0, p2 - ov * 2.5 * t_step)
    q_width = float(t.hidden or 0)
    merge = np.where(kv > 0, (cp - 1) * MERGE_BYTES_PER_ELEMENT * b * t.seq * q_width / tp
                     / profile.hbm_bandwidth_bytes_per_s, 0.0)
    return fwd + merge, bwd + merge


def cp_overlap(profile, runtime) -> float:
    """Share of a ring step's attention the K/V transfer hides in: the runtime profile's
    ``cp_overlap``; on a CPU profile (gloo, one thread of compute) 0."""
    from costmodels.model.compute import runs_on_cpu
    if runs_on_cpu(profile):
        return 0.0
    return float(getattr(runtime, "cp_overlap", 1.0))


def cp_comm(arr, profile, tp: int, b: int, runtime, m: int, block_rows: int, cp_tier=None) -> dict:
    """The cp entry of an estimate's ``comm`` list for ``block_rows`` block rows on the busiest
    rank, ``m`` micro-batches: bytes each GPU sends and the seconds exposed."""
    t = arr.table
    kv = kv_bytes(arr, tp, b)
    per = float(kv[arr.is_block][:1].sum()) if kv.any() else 0.0
    ag = getattr(runtime, "cp_all_gather", 0)
    sent = per * (t.cp - 1) * (3.0 if not ag else 3.0)     # fwd kv, bwd kv + dkv (ring); AG+AG+RS alike
    f, bw = cp_attention_s(arr, profile, tp, b, runtime, cp_tier)
    blk = arr.is_block
    exposed = float(f[blk][:1].sum() + bw[blk][:1].sum()) if blk.any() else 0.0
    return {"kind": "cp", "collective": "all_gather+reduce_scatter" if ag else "p2p ring",
            "group_size": t.cp, "bytes_per_gpu": m * block_rows * sent,
            "time_s": m * block_rows * exposed, "exposed_s": m * block_rows * exposed}


# ---- HSDP ------------------------------------------------------------------------------------
def zero_group(plan) -> int:
    """Ranks a ZeRO shard group spans: ``dp_shard`` under HSDP, else dp (the merged plan's)."""
    return getattr(plan, "dp_shard", None) or plan.dp


def shard_link(profile, plan) -> LinkTier:
    """The link of the HSDP shard group (the inner ``dp_shard`` of the dp ranks)."""
    return link(profile, plan.tp, zero_group(plan))


def zero_link(profile, plan) -> LinkTier:
    """The link ZeRO's gathers and reduce-scatters run on: the dp group's, or HSDP's shard group."""
    if getattr(plan, "dp_shard", None):
        return shard_link(profile, plan)
    return profile.group_link(plan, "dp")


def cp_row_link(profile, plan, arr) -> LinkTier | None:
    """The cp group's link for the merged ``plan`` on a ``CPLocalTable`` (None otherwise): cp
    right outside tp (stride tp), or outside dp·tp under placement ``dp,tp,pp``."""
    cp = getattr(arr.table, "cp", 1)
    if cp <= 1:
        return None
    stride = plan.tp if not plan.placement.startswith("dp") else plan.tp * (plan.dp // cp)
    return link(profile, stride, cp)


def hsdp_sync(params_per_gpu: float, plan, profile, colls, phase,
              grad_per_param: float) -> tuple[str, float, float, float]:
    """(collective names, bytes per GPU, seconds, latency seconds) of HSDP's gradient sync
    (module docstring): ``colls`` (``coefficients.dp_sync_collectives``: the shard group's
    collectives, none when the runtime reduce-scatters in every backward) over the shard group,
    plus, in the "reduce" phase, the all-reduce of the sharded gradients (``grad_per_param``
    bytes each) across the replicas, once per step."""
    shard = zero_group(plan)
    replicas = plan.dp // shard
    inner, outer = shard_link(profile, plan), link(profile, plan.tp * shard, replicas)
    names, nbytes, seconds, lat = [], 0.0, 0.0, 0.0
    for kind, per_param in colls:
        b, s = collective_time(kind, per_param * params_per_gpu, shard, inner, line=True)
        names.append(kind)
        nbytes, seconds, lat = nbytes + b, seconds + s, lat + collective_latency(kind, shard, inner)
    if phase in (None, "reduce") and replicas > 1:
        b, s = collective_time("all_reduce", grad_per_param * params_per_gpu / shard, replicas,
                               outer, line=True)
        names.append("all_reduce(replicas)")
        nbytes, seconds = nbytes + b, seconds + s
        lat += collective_latency("all_reduce", replicas, outer)
    return "+".join(names) or "none", nbytes, seconds, lat
