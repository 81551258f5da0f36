"""autopar's OWN runtime under pp > 1 with ZeRO-2/3 shards gradients per micro-batch (issue 31,
deliverable 4; runtime-profiles/autopar.toml ``[memory] torch_pipelining = 0`` and ``[overlap]
pipeline_zero_reduce_per_micro_batch = 1`` cite it).

autopar's runtime (autopar/runtime/step/data_parallel.py wrap_dp) puts FSDP2 ``fully_shard`` on
each block AND on the stage module and hands it to its own pipeline stage
(autopar/runtime/step/pipeline_stage.py ``ShardedGradStage``), whose backward keeps
``requires_gradient_sync`` on, so FSDP2 reduce-scatters each micro-batch's gradients into the 1/dp
fp32 shards; ZeRO-3 reshards after each backward, ZeRO-2 keeps its weights gathered until the
step's reduce; the schedule runs with ``return_outputs=False``. (torch's own stage, before: every
parameter gathered with a whole fp32 gradient after every backward until the step's last reduce,
m outputs kept on the last stage.) Measured on 4 gloo ranks (pp = 2, dp = 2, a tiny gpt, m = 4,
1F1B) for ZeRO-2 and ZeRO-3 by wrapping each local stage's backward and reduce: after every
micro-batch's backward (and after the reduce) what the stage's FSDP parameters hold (gathered
weights, whole and sharded gradients, their dtype) and how many micro-batch outputs the last stage
keeps (``output_chunks``). A torch upgrade that changes any of it fails here, and the profile
figures must follow. ``python benchmarks/measure_autopar_pp_zero_memory.py`` prints the records.
About 20 s of 4 processes: slow.
"""
from __future__ import annotations

import numpy as np
import pytest

SPEC = "gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8,dropout=0"
N_MICRO = 4


def fsdp_params(module) -> list:
    """Every FSDPParam of the FSDP states under ``module`` (the stage's own and its blocks')."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    out, seen = [], set()
    for m in module.modules():
        if isinstance(m, FSDPModule):
            for g in fully_shard.state(m)._fsdp_param_groups:
                for p in g.fsdp_params:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
    return out


def snapshot(stage) -> dict:
    """What the stage's FSDP parameters hold now: gathered weights, whole and sharded gradients
    (counts, bytes, dtypes), and the last stage's kept outputs."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
    params = fsdp_params(stage.submod)
    snap = dict(params=len(params), unsharded=0, whole_grads=0, whole_grad_bytes=0,
                sharded_grads=0, sharded_grad_bytes=0, whole_grad_dtypes=set(), param_dtypes=set())
    for p in params:
        snap["param_dtypes"].add(str(p.sharded_param.dtype))
        if p.sharded_state == ShardedState.UNSHARDED:
            snap["unsharded"] += 1
        whole = getattr(p, "unsharded_accumulated_grad", None)
        if whole is None and hasattr(p, "_unsharded_param"):
            whole = p._unsharded_param.grad
        if whole is not None:
            snap["whole_grads"] += 1
            snap["whole_grad_bytes"] += whole.numel() * whole.element_size()
            snap["whole_grad_dtypes"].add(str(whole.dtype))
        g = p.sharded_param.grad
        if g is not None:
            local = g.to_local() if hasattr(g, "to_local") else g
            snap["sharded_grads"] += 1
            snap["sharded_grad_bytes"] += local.numel() * local.element_size()
    snap["whole_grad_dtypes"] = sorted(snap["whole_grad_dtypes"])
    snap["param_dtypes"] = sorted(snap["param_dtypes"])
    snap["param_bytes_whole"] = sum(p._orig_size.numel() * p.sharded_param.element_size()
                                    for p in params)
    snap["output_chunks"] = len(stage.output_chunks) if stage.is_last else None
    return snap


def _measure() -> list[dict]:
    """On this rank, for ZeRO-2 and ZeRO-3: the second train_step's snapshots (the first one
    infers shapes) after each backward and after the reduce."""
    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    adist.ensure_initialized(4)
    src = load_model(SPEC)
    out = []
    for zero in (2, 3):
        plan = Plan(dp=2, pp=2, zero=zero, micro_batch_size=1, schedule="1f1b")
        runner = apply(src.build("cpu", seed=0), plan, loss_fn=src.loss, spec=SPEC)
        log = []
        for stage in runner._pipe_stages:
            def wrap(name, stage=stage, log=log):
                real = getattr(stage, name)

                def hooked(*args, **kwargs):
                    res = real(*args, **kwargs)
                    log.append(dict(after=name, stage=stage.stage_index, **snapshot(stage)))
                    return res
                setattr(stage, name, hooked)
            wrap("backward_maybe_with_nosync")
            wrap("perform_reduce_grad")
        x, y = src.make_batch(2 * N_MICRO, seed=1)
        sl = slice(runner.dp_rank * N_MICRO, (runner.dp_rank + 1) * N_MICRO)
        for step in range(2):
            log.clear()
            runner.train_step(tuple(t[sl] for t in x), y[sl])
            if step == 0:
                for p in runner.parameters():
                    p.grad = None
        out.append(dict(zero=zero, rank=runner.layout.rank if hasattr(runner, "layout") else None,
                        stage_module_is_fsdp=[type(s.submod).__name__ for s in runner._pipe_stages],
                        log=list(log)))
    return out


def measure() -> list[list[dict]]:
    """Each rank's records (4 gloo ranks)."""
    from autopar.runtime.verify.serial import spawn
    return spawn(_measure, 4)


@pytest.mark.slow
def test_autopar_pp_stages_reduce_scatter_each_micro_batch_and_keep_no_outputs():
    for rank, recs in enumerate(measure()):
        for rec in recs:
            zero = rec["zero"]
            assert rec["stage_module_is_fsdp"] == ["FSDPStageModule"]   # autopar's stage subclass runs
            backs = [e for e in rec["log"] if e["after"] == "backward_maybe_with_nosync"]
            reduce = [e for e in rec["log"] if e["after"] == "perform_reduce_grad"]
            assert len(backs) == N_MICRO and len(reduce) == 1, (rank, zero)
            for i, e in enumerate(backs + reduce, 1):   # from the first backward on: 1/dp fp32 grads
                assert e["params"] > 0 and e["whole_grads"] == 0, (rank, zero, i)
                assert e["sharded_grads"] == e["params"]
                assert e["sharded_grad_bytes"] * 2 == e["param_bytes_whole"]   # dp = 2, even dims
                # ZeRO-3 reshards after each backward; ZeRO-2 keeps its weights gathered to the end
                gathered = e["params"] if zero == 2 and e["after"] != "perform_reduce_grad" else 0
                assert e["unsharded"] == gathered, (rank, zero, i)
                if rank >= 2:                   # the last stage keeps no micro-batch's output
                    assert e["output_chunks"] == 0


def test_autopar_profile_and_amp_memory_price_what_the_world_measured():
    """What the measurement above says, as the cost model prices autopar's runtime: the profile
    switches off torch pipelining's whole gradients (bf16-mixed: pipeline_fsdp_memory) and
    reduce-scatters per micro-batch under pp only; in the amp recipe (autopar validate) a ZeRO-3
    stage under pp gathers two rows and holds 1/dp gradients, as at pp = 1 with one micro-batch,
    plus FSDP2's reduce window of two rows' whole gradients (tests/test_memory_pipeline_backward.py)."""
    import dataclasses

    from synthetic_tables import llama_table

    from costmodels.contracts.plan import Plan
    from costmodels.model.dp_sync import zero_row_collectives
    from costmodels.model.estimate import estimate
    from costmodels.model.memory import STATE_BYTES
    from costmodels.model.table_arrays import table_arrays
    from costmodels.profiles.hardware_files import load_profile
    from costmodels.profiles.runtime import load_runtime
    rt = load_runtime("autopar")
    assert rt.torch_pipelining == 0
    for zero in (2, 3):
        assert "reduce" in zero_row_collectives(Plan(dp=2, pp=2, zero=zero), rt)
        assert "reduce" not in zero_row_collectives(Plan(dp=2, zero=zero), rt)   # pp = 1: once a step
    table = llama_table(8, 1024, 8, 8, 2816, 1024, 256)   # weights outweigh activations
    arr = table_arrays(table)
    hw = dataclasses.replace(load_profile("h100-80g-sxm"), hbm_bytes=1e15)
    bp, bg = STATE_BYTES["amp"][:2]
    for pp in (1, 2):
        plan = Plan(dp=2, pp=pp, micro_batch_size=1, zero=3, schedule="1f1b", recompute="full")
        e = estimate(table, hw, plan, plan.world_size, 8, precision="amp")
        for r, st in enumerate(e.stages_detail):
            sizes = np.concatenate([arr.params[s:t] for s, t in st["rows"]])
            mem = st["memory_bytes"]
            assert mem["gathered"] == pytest.approx(bp * float(np.sort(sizes)[::-1][:2].sum()))
            assert mem["gathered"] < bp * float(sizes.sum())
            whole = bg * float(sizes.sum())   # m = 4: pp = 1 accumulates whole, pp = 2 sharded
            # pp = 2: plus the reduce window, two rows' whole gradients (pipeline_backward_memory)
            window = bg * float(np.sort(sizes)[::-1][:2].sum()) if pp > 1 else 0.0
            assert mem["grads"] == pytest.approx(whole if pp == 1 else whole / 2 + window), (pp, r)
