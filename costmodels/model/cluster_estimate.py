"""What ``estimate`` needs of the hardware per pipeline rank: one profile per rank, and the link
of every cut between ranks of different pools.

Why a separate module: ``costmodels.model.estimate`` prices a plan rank by rank (each chunk, memory,
dp sync and optimizer step of pipeline rank ``r`` on ``RankHardware.profiles[r]``), and this is
the one place that turns what a caller passed — a profile, a ``Cluster``, or a pooled plan
alone — into those per-rank figures. On a uniform cluster every rank gets the same profile and
no cut crosses a pool, so the uniform prediction is the very same arithmetic (the identity
benchmark's 616 cases); a pooled plan whose pools share one profile and the default link prices
exactly as the uniform plan (``tests/test_cluster_estimate.py``).

Cross-pool sends: the p2p of the activation out of chunk ``c`` and of the gradient back into
chunk ``c + 1`` runs on ``Cluster.link`` between the two ranks' pools (same bytes, that link's
α-β), in place of the pool's own pipeline tier.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from costmodels.contracts.errors import PlanError
from costmodels.model.coefficients import cut_p2p
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.cluster import Cluster, cluster_of_plan
from costmodels.profiles.hardware import HardwareProfile, LinkTier
from costmodels.profiles.hardware_files import load_profile


@dataclass
class RankHardware:
    profiles: list[HardwareProfile]          # per pipeline rank
    name: str                                # the Estimate's ``hardware``
    cluster: Cluster | None = None           # None: uniform
    links: dict[int, LinkTier] = field(default_factory=dict)   # chunk c -> link of cut after c

    @property
    def uniform(self) -> bool:
        return self.cluster is None

    def peak_total(self, plan, dtype_bytes: int) -> float:
        """Σ peak FLOP/s over the GPUs the plan uses."""
        per = {}
        for prof in self.profiles:
            per.setdefault(id(prof), [prof, 0])[1] += plan.tp * plan.dp
        return sum(n * prof.peak_flops_per_s(dtype_bytes) for prof, n in per.values())


def rank_hardware(profile, plan) -> RankHardware:
    """Per-rank hardware for ``plan`` given ``profile`` (a profile, a name or path, a Cluster)."""
    if isinstance(profile, Cluster) and len(profile.pools) == 1 and plan.pools is None:
        profile = profile.pools[0].profile
    if plan.pools is None:
        if isinstance(profile, Cluster):
            raise PlanError(f"the plan has no 'pools' but the cluster has {len(profile.pools)} pools; "
                            "run 'autopar search' on this cluster for a pooled plan, or estimate on one profile")
        prof = load_profile(profile)
        return RankHardware([prof] * plan.pp, prof.name)
    cluster = profile if isinstance(profile, Cluster) else cluster_of_plan(plan.pools)
    if isinstance(profile, Cluster) and cluster.spec() != plan.pools and \
            [c for _, c in cluster.spec()] != [c for _, c in plan.pools]:
        raise PlanError(f"the plan's pools {_spec(plan.pools)} are not the cluster's "
                        f"{_spec(cluster.spec())}; estimate it on the cluster it was searched for")
    if len(cluster.pools) != len(plan.pools):
        raise PlanError(f"the plan names {len(plan.pools)} pools but the cluster has "
                        f"{len(cluster.pools)}; estimate it on the cluster it was searched for")
    profs = [cluster.pools[q].profile for q in plan.stage_pools]
    for q in sorted(set(plan.stage_pools)):
        gpn = cluster.pools[q].profile.gpus_per_node
        if plan.tp > gpn or gpn % plan.tp:
            raise PlanError(f"tp={plan.tp} does not fit inside a node of pool {q} "
                            f"({cluster.pools[q].name}, {gpn} GPUs a node); lower tp")
    links = {}
    p, nvs = plan.pp, plan.pp * plan.vpp
    for c in range(nvs - 1):
        a, b = plan.stage_pools[c % p], plan.stage_pools[(c + 1) % p]
        if a != b:
            links[c] = cluster.link(a, b, plan)
    return RankHardware(profs, cluster.label(), cluster, links)


def _spec(pools) -> str:
    return ",".join(f"{ref}:{n}" for ref, n in pools)


def cross_pool_sends(table, chunks: list, stages, plan, hw: RankHardware, coefs: list) -> list:
    """``chunks`` with the p2p of every cut between pools priced on the link between them;
    ``coefs[c]`` is chunk c's ``RowCoefficients`` (its own pool's pipeline tier)."""
    if not hw.links:
        return chunks
    arr = table_arrays(table)
    out = list(chunks)
    for c, link in hw.links.items():
        x = stages[c][1]
        link_s = float(cut_p2p(arr, plan.micro_batch_size, plan.tp, link)[1][x])
        for k in (c, c + 1):   # the send out of chunk c, the gradient back into chunk c + 1
            delta = link_s - float(coefs[k].cut_p2p_s[x])
            out[k] = replace(out[k], pp_s=out[k].pp_s + delta)
    return out


def pool_detail(plan, hw: RankHardware) -> dict:
    """What the Estimate adds for a pooled plan: per pool, GPUs used / idle and its profile."""
    from costmodels.contracts.plan_pools import pool_usage
    usage = pool_usage(plan)
    for u, pool in zip(usage, hw.cluster.pools):
        u["name"] = pool.name
        u["hbm_bytes"] = pool.profile.hbm_bytes
        u["peak_bf16_flops_per_s"] = pool.profile.peak_flops["bf16"]
    links = [{"after_stage": c, "pools": [plan.stage_pools[c % plan.pp], plan.stage_pools[(c + 1) % plan.pp]],
              "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s, "latency_s": t.latency_s}
             for c, t in sorted(hw.links.items())]
    return {"pools": usage, "links": links}
