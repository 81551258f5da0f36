"""NeMo rows as plans: the recipe switches each copy of a run carries (nemo_recipes), the cp rows
of fp8_runs.csv and dgxc_nemo_h100.csv scored with their cp, and FP8 matmuls priced on the
kernel stack whose BF16 times they replace."""
from __future__ import annotations

import dataclasses

import pytest
from synthetic_tables import llama_table

from costmodels.calibration.dgxc_runs import dgxc_runs
from costmodels.calibration.fp8_runs import fp8_runs
from costmodels.calibration.nemo_recipes import nemo_runtime, recipe_notes, row_notes
from costmodels.calibration.validation import VALIDATION_DIR
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.kernel_stacks import stack_profile

FP8_CSV = VALIDATION_DIR / "fp8_runs.csv"


def test_tp_overlap_as_stated_or_inferred_at_tp_above_one():
    assert "tp_comm_overlap" in nemo_runtime("yaml: ub_tp_comm_overlap true", 4)[0]
    assert "tp_comm_overlap" not in nemo_runtime("ub_tp_comm_overlap false", 8)[0]
    rt, inferred = nemo_runtime("", 8)
    assert "tp_comm_overlap" in rt and inferred
    rt, inferred = nemo_runtime("", 1)
    assert "tp_comm_overlap" not in rt and not inferred
    assert nemo_runtime("1 (distributed_fused_adam) grad_sync_dtype bf16", 1)[0] == (
        "megatron:overlap_grad_reduce,overlap_param_gather,distributed_fused_adam,bf16_grad_reduce")


def test_copies_of_one_run_share_their_yaml():
    """The v24.11.1 Nemotron-4 340B yaml says ub_tp_comm_overlap false in dgxc_nemo_h100.csv only;
    its FP8 rows in fp8_runs.csv get that, not the inferred overlap."""
    idx = recipe_notes(FP8_CSV, VALIDATION_DIR / "dgxc_nemo_h100.csv")
    row = {"source_ref": "github.com/NVIDIA/dgxc-benchmarking tag v24.11.1 nemotron/README_340b.md",
           "gpus": "128", "notes": "synthetic data"}
    assert "ub_tp_comm_overlap false" in row_notes(row, idx)
    runs, _ = fp8_runs(FP8_CSV)
    by_id = {r.row_id: r for r in runs}
    assert "tp_comm_overlap" not in by_id["dgxc-v24.11.1-nemotron4-340b-fp8-128"].plans[0].runtime
    assert "tp_comm_overlap" in by_id["dgxc-v24.11.1-nemotron4-15b-fp8-16"].plans[0].runtime


def test_cp_rows_are_scored_with_their_cp():
    runs, skipped = fp8_runs(FP8_CSV)
    assert not [why for _, why in skipped if "context parallel" in why]
    cp = [r for r in runs if r.plans[0].cp > 1]
    assert cp
    for r in cp:
        p = r.plans[0]
        assert p.dp * p.cp * p.tp * p.pp == r.gpus
    dg = [r for r in dgxc_runs() if r.plans[0].cp > 1]
    assert len(dg) == 17 and all(r.role == "check" for r in dg)
    assert all("tp_comm_overlap" in r.plans[0].runtime for r in dg if "70B" in r.model)
    assert all("tp_comm_overlap" not in r.plans[0].runtime for r in dg if "8B" in r.model)


@pytest.mark.parametrize("runtime", ["megatron", "megatron:tp_comm_overlap"])
def test_fp8_replaces_the_stacks_own_bf16_matmul_time(runtime):
    """An FP8 matmul replaces the BF16 time the row was charged on its runtime's kernel stack:
    the H100 profile under Transformer Engine (its stack entry scales the matmul curve) and a
    profile carrying the same constants with no stack entry price FP8 alike. The model before
    subtracted the BF16 time of the unscaled curve, so the two differed."""
    h100 = load_profile("h100-80g-sxm")
    folded = dataclasses.replace(stack_profile(h100, "transformer-engine"), name="h100-te-folded")
    t = llama_table(2, 1024, 8, 8, 4096, 1000, 2048, model="l")
    # no element-wise traffic: the stack's figure for it is keyed by the profile's name
    t = dataclasses.replace(t, rows=tuple(dataclasses.replace(
        r, saved_activation_bytes=0, act_tp_bytes=0, act_attention_core_bytes=0,
        act_attention_mask_bytes=0) for r in t.rows))
    plan = Plan(dp=2, tp=2, sequence_parallel=True, runtime=runtime)
    for p in (plan, plan.with_(precision="fp8")):
        a, b = (estimate(t, prof, p, 4, 8).step_time_s for prof in (h100, folded))
        assert a == pytest.approx(b, rel=1e-9)
    assert estimate(t, h100, plan.with_(precision="fp8"), 4, 8).step_time_s < estimate(t, h100, plan, 4, 8).step_time_s


def test_te_fused_swiglu_keeps_one_mlp_width_tensor_fewer():
    from types import SimpleNamespace

    from synthetic_tables import gpt_table

    from costmodels.model.table_arrays import table_arrays
    from costmodels.model.te_activations import te_saved_less
    te = SimpleNamespace(kernel_stack="transformer-engine")
    fused = llama_table(2, 1024, 8, 2, 2816, 1000, 512, model="l")   # one h -> 2f GEMM, 3f counted
    assert not te_saved_less(table_arrays(fused), Plan(tp=2), te, 2, 2).any()
    eager = dataclasses.replace(fused, model="l-eager", rows=tuple(   # gate and up apart, as traced
        dataclasses.replace(r, matmul_dims=tuple(d for m, n, k in r.matmul_dims for d in (
            ((m, n // 2, k), (m, n // 2, k)) if n == 2 * 2816 else ((m, n, k),))))
        for r in fused.rows))
    arr = table_arrays(eager)
    less = te_saved_less(arr, Plan(tp=2), te, 2, 2)
    assert list(less[arr.is_block]) == [2 * 512 * 2816 * 2 / 2] * 2 and not less[~arr.is_block].any()
    assert not te_saved_less(arr, Plan(tp=2, recompute="full"), te, 2, 2).any()
    assert not te_saved_less(arr, Plan(tp=2), SimpleNamespace(kernel_stack="torch-sdpa"), 2, 2).any()
    gpt = table_arrays(gpt_table(2, 1024, 8, 1000, 512))   # a two-matmul MLP: nothing to save
    assert not te_saved_less(gpt, Plan(), te, 1, 1).any()


def test_te_backward_hides_the_dgrad_collective_behind_wgrad():
    """Without userbuffers, TE's linear backward runs the column-parallel dgrad reduce-scatter
    (all-reduce without SP) behind the wgrad GEMM: half the SP backward TP time stays (the
    row-parallel grad all-gather), none of the all-reduce; the forward is untouched."""
    from types import SimpleNamespace

    import numpy as np

    from costmodels.model.compute import RowTimes
    from costmodels.model.te_backward_overlap import te_async_backward
    z = np.zeros(2)
    rt = RowTimes(fwd_s=np.ones(2), bwd_s=np.full(2, 2.0), recompute_s=z, tp_fwd_s=np.full(2, 0.4),
                  tp_bwd_s=np.full(2, 0.4), tp_recompute_s=z, tp_bytes_fwd=z, tp_bytes_bwd=z,
                  tp_bytes_recompute=z, bwd_w_s=np.array([1.0, 0.1]))
    te = SimpleNamespace(kernel_stack="transformer-engine", tp_comm_overlap=0)
    sp = te_async_backward(rt, te, 4, True)
    assert list(sp.tp_bwd_s) == pytest.approx([0.2, 0.3]) and list(sp.tp_fwd_s) == [0.4, 0.4]
    assert list(te_async_backward(rt, te, 4, False).tp_bwd_s) == pytest.approx([0.0, 0.3])
    ub = SimpleNamespace(kernel_stack="transformer-engine", tp_comm_overlap=1)
    assert te_async_backward(rt, ub, 4, True) is rt            # userbuffers price all of them
    assert te_async_backward(rt, SimpleNamespace(kernel_stack="megatron-lm-2021"), 4, True) is rt
