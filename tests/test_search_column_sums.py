"""The least ordered column sum of an interleaved split (``autopar.search.column_sums``): on rows of
two block kinds (a prefix of one, then the other, as DeepSeek-V3's dense then MoE blocks) it is the
enumeration's least ``Σ_c C_c``; on a real configuration, enumerated, the level-1 bound that uses
it stays under every split's estimate."""
import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from synthetic_tables import gpt_table

from autopar.search.column_sums import ordered_column_sum
from autopar.search.costs import Costs
from autopar.search.space import Config
from costmodels.profiles.hardware_files import load_profile


def _two_kinds(pp: int, vpp: int):
    # embedding, 3 dense blocks (half a MoE block), 9 MoE blocks, head (as DeepSeek-V3-like's rows)
    tau = np.array([0.07] + [0.48] * 3 + [1.0] * 9 + [0.69])
    cuts = np.full(len(tau), 0.05)
    cuts[5] = 0.03   # one cheaper cut: the bound charges the cheapest everywhere
    coef = SimpleNamespace(row_s=tau, cut_p2p_s=cuts)
    return SimpleNamespace(pp=pp, vpp=vpp, n=len(tau), coef=coef, split_backward=False, v_placement=False)


@pytest.mark.parametrize("pp,vpp", [(2, 2), (2, 3), (3, 2)])
def test_ordered_column_sum_is_the_enumerated_least(pp, vpp):
    t = _two_kinds(pp, vpp)
    tau, n, S = t.coef.row_s, t.n, pp * vpp
    send = float(t.coef.cut_p2p_s[1:].min())
    best = math.inf
    for cuts in itertools.combinations(range(1, n), S - 1):
        xs = (0, *cuts, n)
        chunk = [float(tau[xs[s]:xs[s + 1]].sum()) + send * ((s > 0) + (s < S - 1)) for s in range(S)]
        best = min(best, sum(max(chunk[c * pp:(c + 1) * pp]) for c in range(vpp)))
    got = ordered_column_sum(t)
    assert got == pytest.approx(best, rel=1e-12)
    # ... and strictly above what free balancing of the same rows allows (the point of ordering)
    assert got > (float(tau.sum()) + send * (2 * S - 2)) / pp + 0.05


@pytest.mark.parametrize("vpp", [2, 3])
def test_level_one_bound_stays_under_every_split(vpp):
    t = gpt_table(7, 256, 4, 512, 64, model="gpt:layers=7,hidden=256,heads=4,vocab=512,seq=64")
    costs = Costs(t, load_profile("a100-80g-sxm"), 32)
    c = Config(dp=4, tp=1, pp=2, vpp=vpp, micro_batch_size=1, zero=1, recompute="none",
               sequence_parallel=False, schedule="interleaved-1f1b")
    terms = costs.terms(c)
    terms.set_block_floor()
    assert ordered_column_sum(terms) > 0
    bound, best = terms.time_lower_bound(), math.inf
    for cuts in itertools.combinations(range(1, terms.n), 2 * vpp - 1):
        xs = (0, *cuts, terms.n)
        best = min(best, costs.evaluate(c.plan(tuple((xs[i], xs[i + 1]) for i in range(2 * vpp))))["step_time_s"])
    assert bound <= best * (1 + 1e-12)
