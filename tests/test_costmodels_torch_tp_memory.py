"""torch's TP with sequence parallelism keeps each column-parallel projection's gathered input
whole (costmodels/model/torch_tp_memory.py): a block two ``b·s·h`` tensors, the head one, and
full recompute's working set both of a block's; Megatron keeps their ``1/t`` shards. The search's
memory rows carry the same bytes as ``estimate``. No torch, analytic tables."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from synthetic_tables import llama_table

from costmodels.model.coefficients import row_coefficients
from costmodels.model.estimate import estimate
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(4, 1024, 8, 4, 2816, 32000, 2048)
ARR = table_arrays(TABLE)
H100 = dataclasses.replace(load_profile("h100-80g-sxm"), hbm_bytes=1e15)   # never "does not fit"
HIDDEN_INPUT = 2.0 * 2 * 2048 * 1024   # one b·s·h bf16 tensor at micro-batch 2
TP = 4


def _plan(recompute, runtime="fsdp", sp=True):
    from costmodels.contracts.plan import Plan
    return Plan(dp=2, tp=TP, micro_batch_size=2, zero=3, sequence_parallel=sp, recompute=recompute, runtime=runtime)


def _delta(recompute):
    """Bytes torch TP's fsdp holds over the same plan with the switch off (fsdp's figure, 0)."""
    off = dataclasses.replace(load_runtime("fsdp"), tp_saves_gathered_inputs=0)
    import costmodels.model.coefficients as coef
    import costmodels.model.estimate as est
    e = estimate(TABLE, H100, _plan(recompute), 8, 16)
    real = est.load_runtime, coef.load_runtime
    try:   # the runtime both estimate and the search's rows read, with the switch off
        est.load_runtime = coef.load_runtime = lambda name=None: off
        o = estimate(TABLE, H100, _plan(recompute), 8, 16)
    finally:
        est.load_runtime, coef.load_runtime = real
    return e.memory_bytes["total"] - o.memory_bytes["total"]


def test_the_fsdp_runtime_keeps_gathered_inputs_and_megatron_does_not():
    assert load_runtime("fsdp").tp_saves_gathered_inputs == 1
    assert load_runtime("megatron").tp_saves_gathered_inputs == 0


def test_blocks_and_head_keep_their_gathered_inputs_whole():
    blocks = int(ARR.is_block.sum())
    assert blocks == 4
    # two gathered inputs a block and one on the head, each b·s·h less the 1/t the model counted
    extra = (2 * blocks + 1) * HIDDEN_INPUT * (1 - 1 / TP)
    plain = dataclasses.replace(load_runtime("fsdp"), tp_saves_gathered_inputs=0)
    from costmodels.model import torch_tp_memory
    got = torch_tp_memory.saved_bytes(ARR, _plan("selective"), load_runtime("fsdp"), "bf16-mixed")
    assert got.sum() == pytest.approx(extra, rel=1e-9)
    assert _delta("selective") == pytest.approx(extra, rel=1e-9)   # estimate: one micro-batch in flight
    assert not torch_tp_memory.saved_bytes(ARR, _plan("selective"), plain, "bf16-mixed").any()
    assert not torch_tp_memory.saved_bytes(ARR, _plan("selective", sp=False), load_runtime("fsdp"), "bf16-mixed").any()


def test_full_recompute_holds_them_in_the_head_and_the_working_set():
    # head: one input; the recomputed block: two; the checkpointed blocks keep only their inputs
    assert _delta("full") == pytest.approx(3 * HIDDEN_INPUT * (1 - 1 / TP), rel=1e-9)
    co = row_coefficients(TABLE, H100, _plan("full"))
    base = row_coefficients(TABLE, H100, _plan("full", runtime="megatron"))
    np.testing.assert_allclose((co.act_none_bytes - base.act_none_bytes)[ARR.is_block],
                               2 * HIDDEN_INPUT * (1 - 1 / TP))
