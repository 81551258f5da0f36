"""torchtitan's eager RMSNorm (fsdp ``eager_rmsnorm``, costmodels/model/eager_norm.py): its two
figures are the byte count benchmarks/measure_eager_rmsnorm_bytes.py makes, each row pays them for
the norms it runs on the tokens its rank holds, and the search's objective still equals
``estimate`` under the option."""
import dataclasses
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from autopar.search.split_model import SplitModel, time_unit
from autopar.trace import table_for
from costmodels.calibration.open_runs import titan_runs
from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import plan_row_times
from costmodels.model.estimate import estimate
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.kernel_stacks import stack_profile
from costmodels.profiles.runtime import load_runtime

SPEC = "llama:layers=4,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1000,seq=128"


@pytest.fixture(scope="module")
def table():
    return table_for(SPEC)


def test_figures_are_the_measured_eager_byte_count():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from measure_eager_rmsnorm_bytes import FUSED_BWD, FUSED_FWD, measure
    m = measure(h=1024, rows=16)
    rt = load_runtime("fsdp:eager_rmsnorm")
    assert abs(m["fwd"] - FUSED_FWD - rt.unfused_norm_fwd_bytes) < 0.5, m["fwd"]
    assert abs(m["bwd"] - FUSED_BWD - rt.unfused_norm_bwd_bytes) < 0.5, m["bwd"]
    assert load_runtime("fsdp").unfused_norm_fwd_bytes == 0.0   # off by default: every plan unchanged


@pytest.mark.parametrize("tp,sp,recompute", [(1, False, "none"), (2, True, "full"), (2, False, "none")])
def test_each_row_pays_its_norms_on_its_tokens(table, tp, sp, recompute):
    prof = load_profile("h100-80g-sxm")
    arr = table_arrays(table)
    b = 2
    plan = Plan(dp=4, tp=tp, micro_batch_size=b, zero=3, sequence_parallel=sp, recompute=recompute,
                runtime="fsdp")
    base = plan_row_times(arr, prof, plan, "bf16-mixed", load_runtime("fsdp"))
    eager_rt = load_runtime("fsdp:eager_rmsnorm")
    eager = plan_row_times(arr, prof, plan.with_(runtime="fsdp:eager_rmsnorm"), "bf16-mixed", eager_rt)
    w = stack_profile(prof, eager_rt.kernel_stack).elementwise_bw
    tokens = b * table.seq / (tp if sp else 1)
    norms = np.array([{"block": 2, "head": 1}.get(r.kind, 0) for r in table.rows])   # Llama: 2 a block, the final one
    per = norms * tokens * table.hidden / w
    assert np.allclose(eager.fwd_s - base.fwd_s, per * 32.0, rtol=1e-9, atol=1e-15)
    assert np.allclose(eager.bwd_s - base.bwd_s, per * 90.0, rtol=1e-9, atol=1e-15)
    again = per * 32.0 * arr.is_block if recompute == "full" else 0.0   # the blocks' norms run again
    assert np.allclose(eager.recompute_s - base.recompute_s, again, rtol=1e-9, atol=1e-15)
    assert np.array_equal(eager.bwd_w_s, base.bwd_w_s)   # the input-gradient pass, not the weights'


def test_objective_equals_estimate_under_eager_rmsnorm(table):
    prof = load_profile("h100-80g-sxm")
    gpus, batch = 16, 32
    costs = Costs(table, prof, batch)
    configs = list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                  fix={"runtime": "fsdp:eager_rmsnorm"}))
    rng = random.Random(3)
    groups: dict = {}
    for c in configs:
        groups.setdefault((c.zero, c.pp > 1, c.tp > 1, c.recompute), []).append(c)
    sample = [rng.choice(g) for g in groups.values()][:6]
    assert len(sample) >= 4
    for c in sample:
        n, S = len(table.rows), c.pp * c.vpp
        cuts = sorted(rng.sample(range(1, n), S - 1))
        stages = tuple(zip([0] + cuts, cuts + [n]))
        est = estimate(table, prof, c.plan(stages), gpus, batch)
        plain = estimate(table, prof, dataclasses.replace(c, runtime="fsdp").plan(stages), gpus, batch)
        assert est.step_time_s > plain.step_time_s, c
        terms = costs.terms(c)
        r = SplitModel(dataclasses.replace(terms, hbm=float(2 ** 60)), fixed_stages=stages, exact=True).solve()
        tol = time_unit(terms.time_lower_bound()) * n * 4 * (terms.m + 2)
        assert r.status == "optimal" and abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s, est)
        assert terms.time_lower_bound() <= est.step_time_s * (1 + 1e-9), c


def test_open_rows_take_the_norm_their_release_config_ran():
    runtime = {(r.hardware, r.model, r.label.split("compile=")[1]): r.plans[0].runtime for r in titan_runs()}
    assert runtime[("h100-80g-sxm", "llama3.1-8b", "no")] == "fsdp:eager_rmsnorm"   # 9dec370 rmsnorm
    assert runtime[("h100-80g-sxm", "llama3.1-8b", "yes")] == "fsdp"                # inductor fuses it
    assert runtime[("a100-80g-sxm", "llama3-70b", "no")] == "fsdp:eager_rmsnorm"    # llama3_70b.toml
    assert runtime[("a100-80g-sxm", "llama3-8b", "no")] == "fsdp"                   # fused_rmsnorm (Triton)
    assert runtime[("a100-80g-sxm", "llama2-13b", "no")] == "fsdp"
