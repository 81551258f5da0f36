"""The (h200-141g-sxm, torch-sdpa) kernel stack: torchtitan's SDPA runs torch's flash backend on
an H200, the kernel ``autopar profile`` timed there, so the entry's attention figure is that
measurement converted (kernel_stacks.toml), and it moves nothing else."""
from __future__ import annotations

from pathlib import Path

from synthetic_tables import llama_table

from costmodels.contracts.files import tomllib
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.kernel_stacks import load_stacks, stack_note, stack_profile
from costmodels.profiles.runtime import load_runtime

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
MEASURED = DATA / "gpu_h200_x1_2026-11-28" / "h200-x1-measured.toml"


def test_the_h200_sdpa_figure_is_the_h200_measurement_converted():
    with open(MEASURED, "rb") as f:
        gpu = tomllib.load(f)["gpu"]
    h200 = load_profile("h200-141g-sxm")
    # fraction of the measured peak -> of the datasheet peak -> forward with the backward at 2.5x
    measured_peak = gpu["peak_bf16_flops_per_s"]["value"]
    of_datasheet = gpu["attention_efficiency"]["value"] * measured_peak / h200.peak_flops["bf16"]
    fwd = of_datasheet * 3.5 / 3
    stacks = load_stacks()
    sdpa = stacks[("h200-141g-sxm", "torch-sdpa")]
    assert round(fwd, 2) == sdpa["attention_efficiency"][0]
    assert sdpa["attention_efficiency"][0] == stacks[("h200-141g-sxm", "autopar-eager")]["attention_efficiency"][0]
    assert set(sdpa) == {"attention_efficiency"}                      # matmuls, element-wise, FP8 kept
    assert "its own constants" in stack_note("h200-141g-sxm", load_runtime("fsdp"))


def test_only_the_h200_attention_moves():
    h200, h100 = load_profile("h200-141g-sxm"), load_profile("h100-80g-sxm")
    on = stack_profile(h200, "torch-sdpa")
    assert on.eff_values == h200.eff_values and on.attention_bwd_ratio == h200.attention_bwd_ratio
    assert on.attention_efficiency > 2 * h200.attention_efficiency
    assert stack_profile(h100, "torch-sdpa") is h100                  # 500 W H100 rows: no clock term
    table = llama_table(2, 4096, 32, 8, 14336, 128256, 8192, model="llama-8b-2l")
    plan = Plan(dp=8, micro_batch_size=1, zero=3, runtime="fsdp")
    sdpa = estimate(table, h200, plan, 8, 8).breakdown_s["compute"]
    composer = estimate(table, h200, plan.with_(runtime="fsdp:fsdp1"), 8, 8).breakdown_s["compute"]
    assert sdpa < composer                                            # the faster attention is priced
