"""autopar's runtime priced as it runs on a GPU (runtime-profiles/autopar.toml): fp32 parameters
under autocast, so in the search's bf16-mixed recipe every micro-batch pays its gradient cast and
accumulation (zero_traffic.grad_accumulate_s) and the dp sync moves fp32 gradients; nothing is
counted twice under the amp recipe, and a CPU profile is untouched."""
import dataclasses

import pytest
from synthetic_tables import gpt_table

from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.model.zero_traffic import grad_accumulate_s
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import _REGISTERED, load_runtime, register_runtime


def _without_accumulation() -> str:
    name = "autopar-no-grad-accumulation-test"
    if name not in _REGISTERED:
        register_runtime(dataclasses.replace(load_runtime("autopar"), name=name, grad_accumulate_bytes=0.0))
    return name


def test_autopar_states_its_fp32_gradients():
    rt = load_runtime("autopar")
    assert rt.grad_accumulate_bytes == 18.0 and rt.grad_reduce_bytes == 4.0
    assert load_runtime("megatron").grad_accumulate_bytes == 0.0
    assert grad_accumulate_s(18.0, "amp", 1e12) == 0.0 and grad_accumulate_s(18.0, "bf16-mixed", 1e12) == 18e-12


def test_each_micro_batch_pays_the_cast_and_accumulation_of_its_parameters():
    t = gpt_table(layers=4, hidden=1024, heads=16, vocab=4096, seq=1024)
    prof = load_profile("a100-80g-sxm")
    plan = Plan(micro_batch_size=8)   # blocks well above the host floor per pass (compute docstring)
    on = estimate(t, prof, plan, 1, 64)
    off = estimate(t, prof, dataclasses.replace(plan, runtime=_without_accumulation()), 1, 64)
    params = sum(r.params for r in t.rows)
    assert on.step_time_s - off.step_time_s == pytest.approx(8 * params * 18.0 / prof.elementwise_bw, rel=0.02)
    # the amp recipe prices the same bytes once, in autocast_step_s: no difference there
    amp_on = estimate(t, prof, plan, 1, 64, precision="amp")
    amp_off = estimate(t, prof, dataclasses.replace(plan, runtime=_without_accumulation()), 1, 64, precision="amp")
    assert amp_on.step_time_s == pytest.approx(amp_off.step_time_s, rel=1e-9)
    cpu = load_profile("cpu-2core")
    assert estimate(t, cpu, plan, 1, 64).step_time_s == pytest.approx(
        estimate(t, cpu, dataclasses.replace(plan, runtime=_without_accumulation()), 1, 64).step_time_s, rel=1e-9)
