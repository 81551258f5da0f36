"""``autopar.search.split_fits``: the NumPy price of a split's memory is the split program's own,
so a candidate it accepts is a split the program accepts (issue 30: the fit check without CP-SAT)."""
import random

from synthetic_tables import tight_memory_costs

from autopar.search.engine import all_splits
from autopar.search.space import Shape, configurations
from autopar.search.split_fits import certified_fit, fits, rank_memory
from autopar.search.split_model import SplitModel
from costmodels.profiles.hardware_files import load_profile

BASE = load_profile("a100-80g-sxm")


def _costs(layers, batch, fraction):
    return tight_memory_costs(layers, batch, fraction)


def _configs(costs, batch):
    return [c for c in configurations(Shape.of(costs.table), 4, batch, 8, {"tp": 1}) if c.pp >= 2
            and c.schedule in ("1f1b", "gpipe", "interleaved-1f1b")]


def test_the_numpy_price_is_the_programs_memory_at_every_split():
    """Every rank's bytes as the program counts them (rounded-up rows, in-flight counts, ZeRO-3's
    two largest rows, full recompute's working set): its maximum equals the memory program's
    optimum with the split pinned, across ZeRO stages, recompute and schedules."""
    rng = random.Random(3)
    costs = _costs(6, 16, 1e6)
    seen = set()
    for c in _configs(costs, 16):
        terms = costs.terms(c)
        splits = list(all_splits(terms.n, terms.n_virtual))
        for st in rng.sample(splits, 1):
            mem = rank_memory(terms, st)
            prog = SplitModel(terms, objective="memory", fixed_stages=st).solve()
            assert prog.status == "optimal" and max(mem) == int(prog.objective_s), (c, st)
        seen.add((c.zero, c.recompute, c.vpp > 1))
    assert {(3, "full", True), (3, "none", False), (0, "full", False)} <= seen


def test_a_certified_fit_is_a_fit_and_certifies_where_memory_is_tight():
    """Where a candidate fits, the memory program finds a split too; on a GPU a little above the
    least memory (many configurations with and without a fitting split) the candidates certify
    most configurations the program says fit, so the CP-SAT check is rarely needed."""
    costs = _costs(8, 16, 0.0012)
    certified = fitting = 0
    for c in _configs(costs, 16):
        terms = costs.terms(c)
        program_fits = SplitModel(terms, objective="memory", fits_only=True).solve().status != "infeasible"
        cert = certified_fit(terms)
        assert program_fits or not cert, c
        certified += cert
        fitting += program_fits
        for st in list(all_splits(terms.n, terms.n_virtual))[:3]:
            assert fits(terms, st) == (max(rank_memory(terms, st)) <= int(terms.hbm))
    assert 0 < fitting and certified >= 0.8 * fitting, (certified, fitting)
