"""What torchtitan's expert mesh can hold (issue 27): the ep / etp of a plan it runs.

torchtitan 0.2.2 (``torchtitan/distributed/parallel_dims.py``) builds its experts' mesh by
unflattening the world into ``(pp, dp_replicate, efsdp, ep, etp)`` with ``efsdp =
dp_shard·cp·tp / (etp·ep)`` (``ParallelDims.build_mesh``, "sparse_mesh"), and ``_validate``
asserts "Currently we only support ETP=TP or ETP=1". So its ep group takes the ``tp/etp`` ranks
an expert is not sharded over as well as ``dp_shard·cp`` ranks — the plan contract's ``ep·etp``
divides ``dp·cp·tp`` (``costmodels.contracts.plan``), the same placement the cost model prices
for the ``fsdp`` runtime (``costmodels.model.experts.ep_span``) — but only inside one FSDP shard
group: the replicas (``data_parallel_replicate_degree``: HSDP's, or DDP's whole dp) hold copies.
"""
from __future__ import annotations

from autopar.export.common import Problem
from costmodels.contracts.plan import Plan


def expert_mesh_problems(plan: Plan) -> list[Problem]:
    """The plan's ep / etp torchtitan cannot build (module docstring), each with its repair."""
    if plan.ep == 1 and plan.etp == 1:
        return []
    out = []
    if plan.ep > 1 and plan.etp not in (1, plan.tp):
        out.append(Problem("etp", plan.etp, "torchtitan runs expert_tensor_parallel_degree 1 or tp only "
                           "(ParallelDims._validate)", {"etp": 1}))
    ddp = plan.zero == 0 and plan.dp > 1
    shard = 1 if ddp else plan.shard_size   # the exporter's data_parallel_shard_degree
    ranks = shard * plan.cp * plan.tp
    if ranks % (plan.ep * plan.etp):
        out.append(Problem("ep", plan.ep, f"torchtitan builds its expert mesh inside one FSDP shard group "
                           f"(efsdp = dp_shard·cp·tp/(etp·ep)), and ep·etp = {plan.ep * plan.etp} does not "
                           f"divide dp_shard·cp·tp = {ranks}", {"ep": 1, "etp": 1}))
    return out
