"""Runtime profiles (runtime-profiles/*.toml, costmodels.profiles.runtime): every shipped one
loads with its sources, options switch figures, bad input is one line naming the field, and a
runtime changes the estimate the way its documented overlap says."""
import copy

import pytest
from synthetic_tables import gpt3_175b, llama3_8b

from costmodels.contracts.errors import PlanError, ProfileError
from costmodels.contracts.files import tomllib
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.runtime import RUNTIMES_DIR, list_runtimes, load_runtime, parse_runtime


def _doc(name):
    with open(RUNTIMES_DIR / f"{name}.toml", "rb") as f:
        return tomllib.load(f)


def test_every_shipped_runtime_loads_with_its_sources():
    assert list_runtimes() == ["autopar", "deepspeed", "fsdp", "megatron"]
    for name in list_runtimes():
        rt = load_runtime(name)
        assert rt.name == rt.base == name and rt.description and rt.sources["capabilities"]
        assert 0 in rt.zero_stages and "1f1b" in rt.schedules
        for key, src in rt.sources.items():
            assert src.strip(), (name, key)
    assert load_runtime(None) is load_runtime("autopar") and load_runtime("autopar").is_default
    # autopar leaves every overlap figure to the hardware profile
    rt = load_runtime("autopar")
    assert rt.dp_overlap is None and rt.zero_overlap is None and rt.compute_slowdown == 0.0


def test_options_replace_the_figures_they_name():
    base, opt = load_runtime("megatron"), load_runtime("megatron:overlap_grad_reduce")
    assert base.dp_overlap == 0.0 and opt.dp_overlap == 1.0 and opt.dp_bucket_bytes == 1.6e8
    assert opt.name == "megatron:overlap_grad_reduce" and opt.options == ("overlap_grad_reduce",)
    assert opt.grad_reduce_bytes == base.grad_reduce_bytes == 4.0
    assert load_runtime("fsdp:bf16_reduce").grad_reduce_bytes == 2.0
    with pytest.raises(ProfileError, match="has no option 'nope'; its options: overlap_grad_reduce"):
        load_runtime("megatron:nope")
    with pytest.raises(ProfileError, match="unknown runtime 'megatorn'; did you mean megatron"):
        load_runtime("megatorn")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["overlap"].__setitem__("dp_sync", {"value": 1.5, "source": "x"}), "overlap.dp_sync.value"),
    (lambda d: d["overlap"].__setitem__("dp_sync", 0.5), "overlap.dp_sync"),
    (lambda d: d["overlap"]["dp_sync"].pop("source"), "overlap.dp_sync.source"),
    (lambda d: d["overlap"].__setitem__("dp_synk", {"value": 1, "source": "x"}), "overlap.dp_synk"),
    (lambda d: d["capabilities"].__setitem__("zero", [1, 4]), "capabilities.zero"),
    (lambda d: d["capabilities"].__setitem__("schedules", ["zigzag"]), "capabilities.schedules"),
    (lambda d: d["capabilities"].__setitem__("uneven_interleaving", "yes"), "capabilities.uneven_interleaving"),
    (lambda d: d["capabilities"].pop("source"), "capabilities.source"),
    (lambda d: d.__setitem__("version", 2), "version"),
    (lambda d: d.pop("name"), "name"),
    (lambda d: d["options"]["overlap_grad_reduce"].pop("description"), "options.overlap_grad_reduce.description"),
    (lambda d: d["kernels"].__setitem__("elementwise_bytes_per_saved_byte", {"value": "3", "source": "x"}),
     "kernels.elementwise_bytes_per_saved_byte.value"),
    (lambda d: d["kernels"].__setitem__("gather_copy_passes", {"value": -2, "source": "x"}),
     "kernels.gather_copy_passes.value"),
    (lambda d: d["kernels"].__setitem__("reduce_copy_passes", {"value": 2}), "kernels.reduce_copy_passes.source"),
    (lambda d: d.__setitem__("host", {"seconds_per_block_pass": {"value": -1e-3, "source": "x"}}),
     "host.seconds_per_block_pass.value"),
    (lambda d: d.__setitem__("host", {"seconds_per_block_pass": {"value": "1ms", "source": "x"}}),
     "host.seconds_per_block_pass.value"),
])
def test_a_malformed_profile_is_one_line_naming_the_field(edit, field):
    doc = copy.deepcopy(_doc("megatron"))
    edit(doc)
    with pytest.raises(ProfileError) as e:
        parse_runtime(doc, "bad.toml")
    msg = str(e.value)
    assert "\n" not in msg and f"'{field}'" in msg and "bad.toml" in msg, msg


def test_a_profile_on_disk_with_options(tmp_path):
    doc = (RUNTIMES_DIR / "megatron.toml").read_text().replace('name = "megatron"', 'name = "mine"')
    path = tmp_path / "mine.toml"
    path.write_text(doc)
    rt = load_runtime(f"{path}:overlap_grad_reduce")
    assert rt.base == "mine" and rt.dp_overlap == 1.0
    bad = tmp_path / "broken.toml"
    bad.write_text("version = 1\nname = [")
    with pytest.raises(ProfileError, match="is not valid TOML"):
        load_runtime(str(bad))


def test_estimate_refuses_what_the_runtime_cannot_run():
    t = llama3_8b(seq=4096)
    with pytest.raises(PlanError, match="runtime 'megatron' has no ZeRO-3"):
        estimate(t, "h100-80g-sxm", Plan(dp=8, zero=3, runtime="megatron"), 8, 16)
    with pytest.raises(PlanError, match="cannot combine ZeRO-3 with a pipeline"):
        estimate(t, "h100-80g-sxm", Plan(dp=4, pp=2, zero=3, runtime="deepspeed"), 8, 16)
    with pytest.raises(PlanError, match="no 'gpipe' schedule"):
        estimate(t, "h100-80g-sxm", Plan(dp=4, pp=2, schedule="gpipe", runtime="megatron"), 8, 16)
    with pytest.raises(PlanError, match="precision 'amp' is not a recipe of runtime 'fsdp'"):
        estimate(t, "h100-80g-sxm", Plan(dp=8, runtime="fsdp"), 8, 16, precision="amp")


def test_megatron_exposes_the_dp_sync_unless_it_overlaps_grad_reduce():
    """Megatron-LM of 2021 all-reduces after the backward: the whole sync is exposed; with
    --overlap-grad-reduce only the last bucket (and the slowdown of the hidden rest) remains."""
    t = gpt3_175b()
    plan = Plan(dp=16, tp=8, pp=8, micro_batch_size=1, zero=1, recompute="selective",
                sequence_parallel=True, attention="math")
    auto = estimate(t, "a100-80g-sxm", plan, 1024, 1536)
    mega = estimate(t, "a100-80g-sxm", plan.with_(runtime="megatron"), 1024, 1536)
    over = estimate(t, "a100-80g-sxm", plan.with_(runtime="megatron:overlap_grad_reduce"), 1024, 1536)
    [dp] = [c for c in mega.comm if c["kind"] == "dp"]
    assert mega.breakdown_s["dp_exposed"] >= dp["time_s"]   # nothing hidden (the max over ranks)
    assert auto.breakdown_s["dp_exposed"] < over.breakdown_s["dp_exposed"] < mega.breakdown_s["dp_exposed"]
    # both reduce fp32 gradients: Megatron's fp32 main grads, autopar's fp32 parameters (autopar.toml)
    assert mega.comm_bytes["dp"] == auto.comm_bytes["dp"] > 0
    assert mega.plan.runtime == "megatron" and mega.to_dict()["runtime"] == "megatron"
    assert "runtime:megatron" in mega.plan.label()


def test_fsdp_zero3_pays_its_first_gather_and_reduces_every_micro_batch():
    t = llama3_8b(seq=4096)
    plan = Plan(dp=8, zero=3, micro_batch_size=1)
    auto = estimate(t, "h100-80g-sxm", plan, 8, 32)
    fsdp = estimate(t, "h100-80g-sxm", plan.with_(runtime="fsdp"), 8, 32)
    # both pay their exposed first gathers and the GPU's slowdown; fsdp also reduces every micro-batch
    assert 0.0 < auto.breakdown_s["zero_exposed"] < fsdp.breakdown_s["zero_exposed"]
    [z] = [c for c in fsdp.comm if c["kind"] == "zero"]
    assert z["collective"] == "all_gather+reduce_scatter"
    assert [c["collective"] for c in fsdp.comm if c["kind"] == "dp"] == ["none"]
    assert fsdp.comm_bytes["zero"] > auto.comm_bytes["zero"]


def test_the_gpu_profiles_slowdown_replaces_the_runtimes_assumed_one():
    """A hidden collective costs the step the GPU's fitted collective_slowdown whatever runtime
    issues it; the runtime's compute_slowdown only where the hardware profile has none."""
    import dataclasses

    from costmodels.model.coefficients import collective_slowdown, row_coefficients
    from costmodels.profiles.hardware_files import load_profile
    h100 = load_profile("h100-80g-sxm")
    bare = dataclasses.replace(h100, collective_slowdown=None)
    assert h100.collective_slowdown > load_runtime("fsdp").compute_slowdown > 0.0
    for rt in ("autopar", "fsdp", "megatron"):
        assert collective_slowdown(h100, load_runtime(rt)) == h100.collective_slowdown
        assert collective_slowdown(bare, load_runtime(rt)) == load_runtime(rt).compute_slowdown
    t = llama3_8b(seq=4096)
    plan = Plan(dp=8, zero=3, micro_batch_size=1, runtime="fsdp")
    fitted, assumed = estimate(t, h100, plan, 8, 32), estimate(t, bare, plan, 8, 32)
    co = row_coefficients(t, h100, plan)
    hidden = fitted.num_micro_batches * float(co.zero_fwd_s.sum() + co.zero_bwd_s.sum())
    extra = fitted.breakdown_s["zero_exposed"] - assumed.breakdown_s["zero_exposed"]
    # every gather hides on NVLink here: the exposure grows by (s_gpu - s_runtime) x the hidden
    # collectives, less the same share of the exposed edges, which pay (1 - s) of themselves
    assert 0.0 < extra <= (h100.collective_slowdown - 0.1) * hidden + 1e-9
    assert extra > 0.8 * (h100.collective_slowdown - 0.1) * hidden


def test_split_backward_schedules_on_autopar_expose_the_zero01_gradient_all_reduce():
    """autopar's runtime all-reduces ZeRO 0/1 gradients after the step under the split-backward
    schedules (torch's W pass bypasses DDP's hooks): the estimate exposes that all-reduce whole,
    and not under ZeRO-2 (FSDP2's path) or 1F1B, where it hides in the backward as before."""
    import dataclasses

    from synthetic_tables import gpt_table

    from costmodels.contracts.plan import Plan
    from costmodels.model.estimate import estimate
    from costmodels.profiles.runtime import _REGISTERED, load_runtime, register_runtime
    t = gpt_table(8, 1024, 16, 50304, 1024)
    if "autopar-dp-in-backward" not in _REGISTERED:
        register_runtime(dataclasses.replace(load_runtime("autopar"), name="autopar-dp-in-backward",
                                             split_backward_dp_after_step=False))
    assert load_runtime("autopar").split_backward_dp_after_step
    for sched, vpp, zero, moved in (("zb-v", 2, 1, True), ("interleaved-zb", 1, 0, True),
                                    ("zb-v", 2, 2, False), ("1f1b", 1, 1, False)):
        plan = Plan(dp=4, pp=2, vpp=vpp, schedule=sched, zero=zero)
        after = estimate(t, "h100-80g-sxm", plan, 8, 64)
        during = estimate(t, "h100-80g-sxm", plan.with_(runtime="autopar-dp-in-backward"), 8, 64)
        if moved:
            assert after.breakdown_s["dp_exposed"] > during.breakdown_s["dp_exposed"], sched
            assert after.step_time_s > during.step_time_s
        else:
            assert after.step_time_s == during.step_time_s, (sched, zero)
