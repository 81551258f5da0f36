"""NeMo's published TFLOP/s per GPU as step times, and NeMo's long-sequence runs priced with the
settings NeMo ran them under (benchmarks/bench_costmodels_cp.py reads both).

Check data: the dgxc Llama 3.1 rows of ``cp_runs.csv`` publish a step time AND an MFU (against
989 TFLOP/s); NeMo's FLOP count (``nemo_flops``) must turn the one into the other.
"""
from __future__ import annotations

import csv
from pathlib import Path

from autopar.trace import table_for
from costmodels.calibration.cp_runs import nemo_long_sequence_plan
from costmodels.calibration.nemo_flops import nemo_llama_flops, step_from_tflops
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate

ROWS = Path(__file__).parent / "data" / "validation" / "cp_runs.csv"
H100_BF16_PEAK_TFLOPS = 989.0   # the dgxc READMEs' MFU denominator (cp_runs.csv metric_def)


def test_nemo_flop_count_turns_published_mfu_into_the_published_step():
    rows = [r for r in csv.DictReader(open(ROWS))
            if r["row_id"].startswith("dgxc-v24.11.1-llama3-") and r["precision"] == "bf16" and r["mfu_pct"]]
    assert len(rows) >= 10
    for r in rows:
        flops = nemo_llama_flops(int(r["global_batch"]), int(r["seq"]), int(r["layers"]), int(r["hidden"]),
                                 int(r["heads"]), int(r["kv_heads"]), int(r["ffn"]), int(r["vocab"]))
        step = step_from_tflops(flops, float(r["mfu_pct"]) / 100 * H100_BF16_PEAK_TFLOPS, int(r["gpus"]))
        assert abs(step / float(r["step_time_s"]) - 1) < 0.005, r["row_id"]


def test_nemo_counts_the_whole_score_matrix():
    # the attention term is 12·s/h of the bracket: doubling s at fixed tokens adds 12·s/h·(L·h²·tokens)
    a = nemo_llama_flops(2, 8192, 32, 4096, 32, 8, 14336, 128256)
    b = nemo_llama_flops(1, 16384, 32, 4096, 32, 8, 14336, 128256)
    assert abs((b - a) - 16384 * 32 * 4096 ** 2 * 12 * 8192 / 4096) / a < 1e-9


def test_long_sequence_cp_run_gets_neMo_optimizer_and_sequence_parallel():
    rt = "megatron:overlap_grad_reduce,overlap_param_gather,tp_comm_overlap"
    spec = "llama:layers=2,hidden=1024,heads=8,kv_heads=8,ffn=2816,vocab=1024"
    table = table_for(spec, micro_batch=1, seq=8192)
    bare = Plan(dp=2, cp=2, tp=4, precision="fp8", runtime=rt)
    nemo = nemo_long_sequence_plan(bare)
    assert (nemo.zero, nemo.sequence_parallel) == (1, True)
    assert nemo_long_sequence_plan(Plan(dp=2, cp=2)).sequence_parallel is False   # no TP, no SP
    a = estimate(table, "h100-80g-sxm", bare, 16, 8).memory_bytes["activations"]
    b = estimate(table, "h100-80g-sxm", nemo, 16, 8).memory_bytes["activations"]
    assert b < 0.5 * a   # sequence parallelism shards the norm / residual activations over tp
