"""What a Megatron-core run holds in proportion to the sequence beside its saved activations
(costmodels/model/long_sequence_memory.py), the norm tensors Transformer Engine does not keep
(te_activations.eager_norm_extra), and Megatron's 1F1B with fewer micro-batches than stages
(runnable.clips_warmup): the terms that decide which no-CP layout of a long-sequence sweep fits (issue 26)."""
from __future__ import annotations

import os
import sys

import pytest

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.runnable import check_schedule
from costmodels.model.estimate import estimate
from costmodels.model.long_sequence_memory import head_gather_buffer_bytes, userbuffer_bytes
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_tables import llama3_8b  # noqa: E402

MEGATRON = "megatron:overlap_grad_reduce,overlap_param_gather"
SEQ, GPUS, BATCH = 65536, 64, 64


def _plan(**kw) -> Plan:
    kw = {"dp": 8, "tp": 8, "micro_batch_size": 1, "zero": 1, "sequence_parallel": True,
          "runtime": MEGATRON + ",tp_comm_overlap", **kw}
    return Plan(**kw)


@pytest.mark.parametrize("precision, ag_bytes", [("bf16", 2), ("fp8", 1)])
def test_userbuffers_are_ten_full_sequence_buffers_of_the_cp_rank(precision, ag_bytes):
    """TE's initialize_ub(shape=[seq·mbs/cp, hidden]): six all-gather buffers (uint8 under FP8)
    and four bf16 reduce-scatter ones; none without the switch, without tp, or off Megatron."""
    table, plan = llama3_8b(SEQ), _plan(precision=precision)
    rt = load_runtime(plan.runtime)
    assert userbuffer_bytes(table, plan, rt) == SEQ * 4096 * (6 * ag_bytes + 4 * 2)
    for other in (plan.with_(runtime=MEGATRON), plan.with_(tp=1, dp=64, sequence_parallel=False)):
        assert userbuffer_bytes(table, other, load_runtime(other.runtime)) == 0
    assert userbuffer_bytes(table, plan, load_runtime("fsdp")) == 0
    assert head_gather_buffer_bytes(table, plan, rt) == SEQ * 4096 * 2


def test_estimate_and_search_hold_the_buffers_and_cp_divides_them():
    """The buffers are in estimate's reserve, in the search's memory terms alike, and a cp rank's
    are its S/cp tokens' (the priced table is the rank's share)."""
    from autopar.search.costs import Costs
    from autopar.search.space import Config
    table = llama3_8b(SEQ)
    reserve = {}
    for cp in (1, 4):
        plan = _plan(dp=8 // cp, cp=cp)
        e = estimate(table, "h100-80g-sxm", plan, GPUS, BATCH)
        reserve[cp] = e.memory_bytes["reserve"] - 3e9   # the profile's own reserve
        if cp == 1:
            c = Config(dp=8, tp=8, pp=1, vpp=1, micro_batch_size=1, zero=1, recompute="none",
                       sequence_parallel=True, schedule="1f1b", runtime=plan.runtime)
            costs = Costs(table, load_profile("h100-80g-sxm"), BATCH)
            assert costs.terms(c).reserve == pytest.approx(e.memory_bytes["reserve"])
    assert reserve[1] == pytest.approx(SEQ * 4096 * (10 * 2 + 2))
    assert reserve[4] == pytest.approx(reserve[1] / 4)


def test_megatron_runs_1f1b_with_fewer_micro_batches_than_stages_and_torch_does_not():
    check_schedule(Plan(dp=1, pp=4, runtime=MEGATRON), 1)   # warm-up clipped to the one micro-batch
    with pytest.raises(PlanError, match="at least pp micro-batches"):
        check_schedule(Plan(dp=1, pp=4), 1)


def test_te_keeps_two_tensors_per_norm_where_the_eager_rmsnorm_traces_three():
    """A block row that keeps three hidden-wide tensors per pre-norm outside the TP regions (the
    traced eager RMSNorm) saves 2·h·dtype per token fewer per norm under TE in BF16; a row with
    two (the analytic table, a LayerNorm) is left alone."""
    from dataclasses import replace

    from costmodels.model.table_arrays import table_arrays
    from costmodels.model.te_activations import eager_norm_extra
    table = llama3_8b(8192)
    tokens, h = 8192, 4096
    assert not eager_norm_extra(table_arrays(table)).any()
    rows = tuple(replace(r, saved_activation_bytes=r.saved_activation_bytes + 4 * h * tokens)
                 if r.kind == "block" else r for r in table.rows)
    eager = replace(table, rows=rows, model="llama3-8b-eager-norms")
    extra = eager_norm_extra(table_arrays(eager))
    assert extra[1] == 2 * h * 2 * tokens and extra[0] == 0 and extra[-1] == 0
    plan = _plan(runtime=MEGATRON)
    act = {p: estimate(eager, "h100-80g-sxm", plan.with_(precision=p), 64, 64).memory_bytes["activations"]
           - estimate(table, "h100-80g-sxm", plan.with_(precision=p), 64, 64).memory_bytes["activations"]
           for p in ("bf16", "fp8")}
    assert act["bf16"] == pytest.approx(0.0, abs=1.0)   # the extra tensor is exactly what TE drops
    assert act["fp8"] == pytest.approx(32 * 4 * h * tokens / 8)   # FP8: fp8_saved_bytes stands in
