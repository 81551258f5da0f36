"""Every published FP8 run of fp8_runs.csv ran, so the cost model must predict that it fits
(issue 31: "no open run that ran is predicted not to fit"). A run fits when any reading of its
plan fits (a partial recompute policy is read as none and as full). A run still predicted not to
fit is named in ``KNOWN`` with its reason and its measured figures, never skipped silently; a
``KNOWN`` run that fits now fails the test too, so the list cannot outlive its reason."""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
from world_prefetch import Job, result

from autopar.trace.driver import table_for
from costmodels.calibration.fp8_runs import fp8_runs, run_table
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

CSV = Path(__file__).parent / "data" / "validation" / "fp8_runs.csv"

KNOWN: dict[str, str] = {
    # empty: the last one, NeMo 24.07 Nemotron-4 340B on 128 H100s (79.7 of 79.1 GiB as a SwiGLU
    # llama of ffn 2f/3), fits at 76.0 GiB since Nemotron-4 rows are priced with the traced
    # squared-ReLU model dgxc_runs uses (costmodels.calibration.traced_configs).
}


@functools.cache
def _table(spec: str, seq: int | None = None):
    return table_for(spec, seq=seq)


def _fits(run) -> bool:
    prof = load_profile(run.hardware)
    if run.hbm_bytes:
        prof = dataclasses.replace(prof, hbm_bytes=run.hbm_bytes)
    return any(estimate(run_table(run, _table), prof, p, run.gpus, run.global_batch).fits for p in run.plans)


def unfit_runs() -> tuple[int, set]:
    """(how many runs the CSV holds, the row ids of those predicted not to fit). It traces the 36
    model shapes of the CSV (about 13 s on 2 cores, trace cache off), so it runs ahead in the
    suite's prefetch helper (tests/world_prefetch.py), beside the tests before it."""
    runs, _ = fp8_runs(CSV)
    return len(runs), {r.row_id for r in runs if not _fits(r)}


PREFETCH_WORLD = Job(unfit_runs)


@pytest.mark.slow
def test_every_fp8_run_that_ran_is_predicted_to_fit():
    n, unfit = result(__name__, PREFETCH_WORLD)
    assert n > 100
    assert unfit - set(KNOWN) == set(), f"runs that ran, predicted not to fit: {sorted(unfit - set(KNOWN))}"
    assert set(KNOWN) - unfit == set(), f"KNOWN runs that fit now (drop them): {sorted(set(KNOWN) - unfit)}"


def test_sequence_parallel_is_read_from_the_stack():
    """torchtitan shards norms over tp always; Megatron's TP-comm overlap needs sequence parallelism."""
    runs = {r.row_id: r for r in fp8_runs(CSV)[0]}
    for r in runs.values():
        p = r.plans[0]
        if p.tp > 1 and (r.stack.startswith("fsdp") or "tp_comm_overlap" in p.runtime):
            assert p.sequence_parallel, r.row_id
        if p.tp == 1:
            assert not p.sequence_parallel, r.row_id
    assert runs["tt-t6-llama3.1-405b-cp1"].plans[0].sequence_parallel
    assert runs["nemo2407-h100-gpt3-175b-512"].plans[0].sequence_parallel


def test_nemotron4_rows_are_priced_with_the_traced_squared_relu_model():
    """Every Nemotron-4 row is the traced config dgxc_runs prices the same runs with, traced at the
    row's seq (an hf config's own default is 2048); a Nemotron row of another shape (Nemotron-3,
    no traced config) keeps the llama proxy."""
    runs = {r.row_id: r for r in fp8_runs(CSV)[0]}
    n4 = [r for r in runs.values() if "nemotron4" in r.row_id]
    assert len(n4) > 30
    for r in n4:
        name = "nemotron4-340b.json" if "340b" in r.row_id else "nemotron4-15b.json"
        assert r.spec.startswith("hf:") and r.spec.endswith(name) and r.seq == 4096, r.row_id
    seen = []
    run_table(runs["nemo2407-h100-nemotron4-340b-128"], lambda spec, seq=None: seen.append((spec, seq)))
    assert seen == [(runs["nemo2407-h100-nemotron4-340b-128"].spec, 4096)]
    assert runs["nemo2407-h100-nemotron3-8b-64"].spec.startswith("llama:")


def test_torchtitan_pipeline_rows_keep_their_stage_gathered():
    """torchtitan's default FSDP2 policy under pp (reshard_after_forward = not pp_enabled) is
    ZeRO-2 on the fsdp runtime, as autopar's torchtitan importer reads it; without pp, ZeRO-3."""
    runs = [r for r in fp8_runs(CSV)[0] if r.row_id.startswith("tt-") and r.stack.startswith("fsdp")]
    piped = [r for r in runs if r.plans[0].pp > 1]
    assert len(piped) >= 6
    assert all(p.zero == 2 for r in piped for p in r.plans + r.bf16_plans), [r.row_id for r in piped]
    assert any(r.plans[0].pp == 1 and r.plans[0].zero == 3 for r in runs)
