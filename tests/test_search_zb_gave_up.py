"""A zero-bubble configuration whose branch-and-bound outgrew its node limit under a cut goes to
CP-SAT straight away when it is solved again under a cut no tighter (``zb_exact.solve_split``:
a looser cut prunes less, so the tree would outgrow it again), and gets the branch-and-bound
again under a tighter one."""
import time
from types import SimpleNamespace

from synthetic_tables import gpt_table, no_host_runtime

from autopar.search import zb_exact
from autopar.search.costs import Costs
from autopar.search.frontier_keys import SearchStats
from autopar.search.space import Shape, configurations
from costmodels.profiles.hardware_files import load_profile


def _zb_v_configuration():
    """A 12-layer gpt's first zb-v pp4 configuration on 32 A100s, with its search costs."""
    table = gpt_table(12, 256, 4, 5000, 128, model="gpt-12")
    prof = load_profile("a100-80g-sxm")
    costs = Costs(table, prof, 32)
    return costs, next(c for c in configurations(Shape.of(table), 4, 32, prof.gpus_per_node,
                                                 fix={"schedule": "zb-v", "pp": 4,
                                                      "runtime": no_host_runtime()}))


def test_a_tree_cut_short_is_not_grown_again_under_a_looser_cut(monkeypatch):
    costs, c = _zb_v_configuration()
    frontier = SimpleNamespace(deadline=time.perf_counter() + 60, costs=costs, stats=SearchStats(),
                               _evaluate=lambda plan: {"fits": True})
    terms = costs.terms(c)
    monkeypatch.setattr(zb_exact, "NODE_LIMIT", 1)
    assert zb_exact.solve_split(frontier, c, terms, None, 1e9) is None     # cut short at 1 node
    assert frontier.stats.exact_splits == 1 and terms._bounds["zb_gave_up_at"] == 1e9
    assert zb_exact.solve_split(frontier, c, terms, None, 2e9) is None     # looser: not tried
    assert zb_exact.solve_split(frontier, c, terms, 1e9, None) is None     # as loose: not tried
    assert frontier.stats.exact_splits == 1
    monkeypatch.setattr(zb_exact, "NODE_LIMIT", 10 ** 6)
    res = zb_exact.solve_split(frontier, c, terms, None, 5e8)              # tighter: tried, proved
    assert frontier.stats.exact_splits == 2 and res is not None and res.status == "optimal"


def test_a_configuration_cp_sat_could_not_prove_gets_one_larger_tree(monkeypatch):
    """Once CP-SAT failed to prove it (``Frontier.retried``), the tree is tried again, once, with
    ``RETRY_NODES`` times the nodes, even under a cut no tighter than the one it outgrew."""
    costs, c = _zb_v_configuration()
    frontier = SimpleNamespace(deadline=time.perf_counter() + 60, costs=costs, stats=SearchStats(),
                               _evaluate=lambda plan: {"fits": True}, retried=set())
    terms = costs.terms(c)
    monkeypatch.setattr(zb_exact, "NODE_LIMIT", 2)
    assert zb_exact.solve_split(frontier, c, terms, None, 1e9) is None
    nodes = frontier.stats.exact_nodes
    frontier.retried.add(c)
    monkeypatch.setattr(zb_exact, "RETRY_NODES", 10 ** 6)
    res = zb_exact.solve_split(frontier, c, terms, None, 1e9)      # the larger tree: proved
    assert res is not None and res.status == "optimal" and frontier.stats.exact_nodes > nodes + 2
    splits = frontier.stats.exact_splits
    terms._bounds["zb_gave_up_at"] = 1e9                           # once only: then CP-SAT
    assert zb_exact.solve_split(frontier, c, terms, None, 1e9) is None
    assert frontier.stats.exact_splits == splits
