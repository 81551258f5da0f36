"""The op graph's LP with a node's stages pinned (``autopar.search.zb_node_lp``) is a bound on
every completion of the node: on random small tables and every split-backward schedule, for
each placement of the first rank's stages, it is at most the least step time (the estimate's)
of the splits that complete it, and it prunes (it is above the root's LP somewhere)."""
from hypothesis import given, settings
from hypothesis import strategies as st
from test_search_zb_exact import _case

from autopar.search.zb_bound import graph_bound
from autopar.search.zb_node_lp import NodeLP
from autopar.search.zb_stage_costs import StageCosts


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_pinned_lp_is_below_every_completion(seed):
    table, gpus, batch, c, terms, prof, splits = _case(seed)
    sc = StageCosts(terms)
    lp = NodeLP(terms, sc)
    assert lp.lp is not None
    rank0 = sc.ranks[0]
    best: dict = {}
    for stages in splits:   # the least step time per placement of rank 0's stages
        key = tuple(stages[v] for v in rank0)
        step = sc.step_time([a for a, _ in stages] + [sc.n])
        best[key] = min(best.get(key, float("inf")), step)
    root = graph_bound(terms)
    above = 0
    for key, step in best.items():
        fixed = [None] * sc.S
        for v, (a, b) in zip(rank0, key):
            fixed[v] = sc.stage(v, a, b)
        got = lp.bound(fixed)
        assert 0 < got <= step * (1 + 1e-9), (f"seed {seed}", c, key, got, step)
        above += got > root * (1 + 1e-6)
    assert above > 0, f"seed {seed}: no placement's LP above the root's"
