"""NeMo 24.03's long-sequence runs are priced with Transformer Engine 1.3's attention rate, and NeMo 2's
B200 runs with PyTorch's caching allocator (``costmodels.calibration.nemo_releases``).

The Llama 2 7B sweep of NeMo 24.03.01 on H100 reads as attention at two thirds of the mid-2024 cuDNN
rate (the ``transformer-engine`` entry) at every cp and length; the ``te_1_3`` option's kernel stack
carries that release's rate, fitted on the 1M-token run only. The 128K cp 4 run below is a check row.
"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from autopar.trace import table_for
from costmodels.calibration.cp_runs import cp_runtime, nemo_long_sequence_plan
from costmodels.calibration.nemo_flops import nemo_llama_flops, step_from_tflops
from costmodels.calibration.nemo_releases import TE13_CALIBRATION, release_options, with_release
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.kernel_stacks import stack_figures
from costmodels.profiles.runtime import load_runtime

ROWS = Path(__file__).parent / "data" / "validation" / "cp_runs.csv"
LLAMA2_7B = "llama:layers=32,hidden=4096,heads=32,kv_heads=32,ffn=11008,vocab=32000"


def _rows() -> list[dict]:
    return list(csv.DictReader(open(ROWS)))


def test_the_release_options_follow_the_container_and_gpu():
    rows = _rows()
    te13 = [r for r in rows if release_options(r["container"], r["gpu"]) == ["te_1_3", "default_allocator"]]
    assert te13 and all(r["container"].startswith("NeMo24.03") and "H100" in r["gpu"] for r in te13)
    assert {r["row_id"] for r in te13} >= {r["row_id"] for r in rows if r["row_id"].startswith("nemolong-llama2")}
    alloc = [r for r in rows if "default_allocator" in release_options(r["container"], r["gpu"])]
    assert {r["container"][:9] for r in alloc} == {"NeMo24.03", "NeMo25.04"}   # the two sweeps' releases
    assert all("GB200" not in r["gpu"] for r in alloc)
    assert release_options("nvcr.io/nvidia/nemo:24.09", "H100 80GB SXM (DGX H100)") == []
    assert release_options("NeMo24.03.01.framework", "B200 (DGX B200)") == []
    assert with_release("fsdp", "NeMo24.03.01.framework", "H100 80GB SXM") == "fsdp"
    assert with_release("megatron:overlap_grad_reduce", "NeMo24.03.01.framework", "H100") \
        == "megatron:overlap_grad_reduce,te_1_3,default_allocator"


def test_te_1_3_names_its_own_slower_attention_and_leaves_the_rest():
    rt = load_runtime("megatron:te_1_3")
    assert rt.kernel_stack == "transformer-engine-1.3"
    assert load_runtime("megatron").kernel_stack == "transformer-engine"
    old, new = stack_figures("h100-80g-sxm", "transformer-engine"), stack_figures("h100-80g-sxm", rt.kernel_stack)
    assert new["attention_efficiency"][0] < old["attention_efficiency"][0]
    assert "FITTED" in new["attention_efficiency"][1] and TE13_CALIBRATION[0] in new["attention_efficiency"][1]
    for key in ("matmul_scale", "attention_bwd_ratio", "elementwise_bytes_per_saved_byte"):
        assert new[key][0] == old[key][0]


def _sweep_run(row_id: str, runtime_of):
    r = next(x for x in _rows() if x["row_id"] == row_id)
    runtime = runtime_of(cp_runtime(r["framework"], r["notes"], int(r["tp"])), r)
    plan = nemo_long_sequence_plan(Plan(dp=int(r["dp"]), tp=int(r["tp"]), pp=1, cp=int(r["cp"]), micro_batch_size=1,
                                        runtime=runtime, precision="fp8"))
    seq, batch = int(r["seq"]), int(r["global_batch"])
    table = table_for(LLAMA2_7B, micro_batch=1, seq=seq)
    published = step_from_tflops(nemo_llama_flops(batch, seq, 32, 4096, 32, 32, 11008, 32000),
                                 float(r["tflops_per_gpu"]), plan.world_size)
    return estimate(table, "h100-80g-sxm", plan, plan.world_size, batch).step_time_s, published


def test_a_nemo_24_03_cp_run_is_priced_within_ten_percent_only_with_its_release():
    row_id = "nemolong-llama2-7b-128k-cp4"
    assert row_id not in TE13_CALIBRATION   # check rows
    with_it, published = _sweep_run(row_id, lambda rt, r: with_release(rt, r["container"], r["gpu"]))
    without, _ = _sweep_run(row_id, lambda rt, r: rt)
    assert abs(with_it / published - 1) < 0.10
    assert without / published - 1 < -0.20   # the mid-2024 cuDNN rate: far too fast


def test_the_default_allocator_holds_more_memory_for_the_same_time():
    table = table_for(LLAMA2_7B, micro_batch=1, seq=32768)
    plans = [Plan(dp=4, tp=2, cp=2, micro_batch_size=1, zero=1, sequence_parallel=True, precision="fp8",
                  runtime=f"megatron:overlap_grad_reduce{extra}") for extra in ("", ",default_allocator")]
    base, frag = (estimate(table, "b200-180g-sxm", p, 16, 16) for p in plans)
    assert frag.step_time_s == pytest.approx(base.step_time_s)
    grown = frag.memory_bytes["total"] - base.memory_bytes["total"]
    assert grown == pytest.approx(0.11 * base.memory_bytes["activations"], rel=0.05)
