"""ZeRO-3 under a pipeline: torchtitan's FSDP2 keeps every block of a stage gathered
(``reshard_after_forward = not pp_enabled``), autopar's runtime reshards after forward
(costmodels/model/pipeline_gathered.py). ``estimate`` charges the fsdp runtime the rank's whole
local weights and autopar's runtime the two largest rows, and the search's split program holds
the same memory as ``estimate`` for both."""
import numpy as np
from synthetic_tables import llama_table

from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from autopar.search.split_model import SplitModel
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.model.pipeline_gathered import keeps_stage_gathered
from costmodels.profiles.hardware_files import load_profile


def _table():
    return llama_table(8, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")


def test_fsdp_keeps_the_stage_gathered_under_pp_autopar_reshards():
    table, prof = _table(), load_profile("h100-80g-sxm")
    params = np.array([r.params for r in table.rows], dtype=float)
    stages = ((0, 5), (5, len(table.rows)))
    got = {}
    for rt in ("fsdp", "autopar"):
        plan = Plan(dp=4, tp=2, pp=2, zero=3, micro_batch_size=1, stages=stages, runtime=rt)
        e = estimate(table, prof, plan, 16, 64)
        got[rt] = e.memory_bytes["gathered"]   # the most loaded rank's
    whole = [2.0 * params[s:e].sum() / 2 for s, e in stages]
    two = [2.0 * np.sort(params[s:e])[::-1][:2].sum() / 2 for s, e in stages]
    assert keeps_stage_gathered(Plan(dp=4, tp=2, pp=2, zero=3, runtime="fsdp"))
    assert not keeps_stage_gathered(Plan(dp=8, tp=2, pp=1, zero=3, runtime="fsdp"))
    assert not keeps_stage_gathered(Plan(dp=4, tp=2, pp=2, zero=3, runtime="autopar"))
    assert any(abs(got["fsdp"] - w) <= 1.0 for w in whole), (got, whole)
    assert any(abs(got["autopar"] - t) <= 1.0 for t in two), (got, two)
    assert got["fsdp"] > got["autopar"]


def test_split_program_memory_equals_estimate_when_the_stage_stays_gathered():
    table, prof, gpus, batch = _table(), load_profile("h100-80g-sxm"), 16, 64
    costs = Costs(table, prof, batch)
    configs = [c for c in configurations(Shape.of(table), gpus, batch, prof.gpus_per_node, fix={"runtime": "fsdp"})
               if c.zero == 3 and c.pp > 1 and c.dp > 1][:4]
    assert configs
    for c in configs:
        S = c.pp * c.vpp
        n = len(table.rows)
        b = [round(i * n / S) for i in range(S + 1)]
        stages = tuple((b[i], b[i + 1]) for i in range(S))
        est = estimate(table, prof, c.plan(stages), gpus, batch)
        terms = costs.terms(c)
        assert not terms.zero3_buffer
        mem = SplitModel(terms, objective="memory", fixed_stages=stages).solve()
        total = est.memory_bytes["total"]
        assert total - 1 <= mem.objective_s <= total + 4 * n + 8, (c, mem.objective_s, total)
