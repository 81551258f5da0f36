"""torch's pipelining keeps every micro-batch's output on the last stage for the step
(``output_chunks``; costmodels/model/pipeline_fsdp_memory.held_output_bytes): ``m`` bf16 logits
tensors, vocab-sharded over tp, on the rank holding the head row only; the search's state rows
carry the same bytes once it knows ``m`` (``autopar.search.costs.Costs.terms``). No torch."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from synthetic_tables import llama_table

from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import row_coefficients
from costmodels.model.estimate import estimate
from costmodels.model.memory import logits
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile

TABLE = llama_table(8, 1024, 8, 4, 2816, 32000, 2048)
ARR = table_arrays(TABLE)
H100 = dataclasses.replace(load_profile("h100-80g-sxm"), hbm_bytes=1e15)   # never "does not fit"
PLAN = Plan(dp=2, tp=2, pp=2, micro_batch_size=1, zero=2, sequence_parallel=True, runtime="fsdp")
LOGITS_BF16 = 2.0 * float(logits(ARR, 1).sum()) / 2   # one micro-batch's logits, vocab shard of tp 2


def _ranks(plan, global_batch):
    e = estimate(TABLE, H100, plan, plan.world_size, global_batch)
    return [d["memory_bytes"]["total"] for d in e.stages_detail]


def test_the_last_stage_holds_every_micro_batchs_logits():
    four, eight = _ranks(PLAN, 8), _ranks(PLAN, 16)   # 4 and 8 micro-batches a step
    # 1F1B's last rank holds one micro-batch in flight either way: the held outputs are the change
    assert eight[-1] - four[-1] == pytest.approx(4 * LOGITS_BF16, rel=1e-9)
    assert eight[0] - four[0] == pytest.approx(0.0, abs=1.0)   # the first rank holds no output
    megatron = PLAN.with_(runtime="megatron", zero=1)           # its own pipeline, no output_chunks
    assert np.allclose(_ranks(megatron, 16), _ranks(megatron, 8))


def test_the_search_charges_them_on_the_head_row():
    costs = Costs(TABLE, H100, 16)
    shape = Shape.of(TABLE)
    for c in configurations(shape, 8, 16, H100.gpus_per_node, fix={"runtime": "fsdp"}):
        if c.tp == 2 and c.pp == 2 and c.micro_batch_size == 1 and c.vpp == 1 and c.dp == 2:
            t = costs.terms(c)
            head = [i for i, r in enumerate(TABLE.rows) if r.kind == "head"]
            plain = row_coefficients(TABLE, H100, c)   # the per-row figures before m is known
            held = t.coef.state_bytes[head].sum() - plain.state_bytes[head].sum()
            np.testing.assert_array_equal(np.delete(t.coef.state_bytes, head), np.delete(plain.state_bytes, head))
            assert t.m == 8
            assert held == pytest.approx(8 * LOGITS_BF16, rel=1e-9)
            return
    pytest.fail("no dp2·tp2·pp2 configuration of the fsdp runtime")
