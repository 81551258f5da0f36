"""The search's expert-parallel degrees that take ranks from tp (issue 27, Megatron's rule).

The plan contract lets ``ep·etp`` divide ``dp·cp·tp`` (``costmodels.contracts.plan``): with
``etp < tp`` the ``tp/etp`` ranks of a tp group an expert is not sharded over join the expert
groups, so ep may exceed ``dp·cp`` (DeepSeek-V3 at tp 2, etp 1, ep 64 over dp 32). A runtime
whose expert mesh is built over the tp·cp·dp ranks (``[capabilities] expert_mesh_over_tp``:
Megatron-core and torchtitan) is offered those ep as well; the others keep the divisors of dp
(``costmodels.profiles.runtime_rules.expert_mesh_rule`` refuses the rest). The configurations
are built before cp is applied (``autopar.search.context_space``), so the ranks here are
``dp·tp/etp``: any ep dividing them also satisfies the contract with cp > 1. The plans are
priced by the same ``costmodels.model.experts`` terms ``estimate`` reads (``ep_span`` places
the ep group innermost over the freed tp ranks; ``expert_zero_group`` sizes the expert-dp group
``dp·cp·(tp/etp)/ep``)."""
from __future__ import annotations

from costmodels.contracts.runnable import divisors


def eps_over_tp(eps: list[int], experts: int, dp: int, tp: int, etp: int) -> list[int]:
    """``eps`` (the ep dividing dp) followed by the ep dividing ``dp·tp/etp`` but not dp that
    divide the ``experts`` routed experts; ``eps`` alone when etp does not divide tp (the
    contract refuses such an etp) or etp = tp (no tp rank is freed)."""
    if tp % etp or etp == tp:
        return list(eps)
    extra = [e for e in divisors(dp * (tp // etp)) if dp % e and experts % e == 0]
    return list(eps) + extra
