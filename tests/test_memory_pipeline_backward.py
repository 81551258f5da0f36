"""What autopar's runtime holds inside a backward under pp > 1 (issue 31;
costmodels/model/pipeline_backward_memory.py): one set of autocast casts per micro-batch in
flight, and FSDP2's reduce window (the previous row's reduce-scatter input kept while the next
row's backward runs). The two runtime mechanisms are pinned single-process (torch 2.13 CPU), and
the amp estimate is checked to charge them where they apply and nowhere else.

Single process, small nets: fast."""
from __future__ import annotations

import pytest
import torch
from torch import nn

SPEC = "gpt:layers=4,hidden=64,heads=4,vocab=64,seq=8,dropout=0"


def _saved_bf16_weight_copies(fresh: bool) -> int:
    """Distinct bf16 tensors shaped like a weight that two micro-batches' graphs save, both in
    flight (forwards run, no backward yet) inside one autocast region; ``fresh``: autocast's cache
    cleared before each forward, as the runtime's pipeline stages do."""
    from autopar.runtime.step.schedules import fresh_autocast_casts
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 24), nn.Linear(24, 16))
    shapes = {tuple(lin.weight.shape) for lin in net}
    ptrs: set[int] = set()

    def pack(t):
        if t.dtype == torch.bfloat16 and tuple(t.shape) in shapes | {s[::-1] for s in shapes}:
            ptrs.add(t.untyped_storage().data_ptr())
        return t

    outs = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(2):
                if fresh:
                    fresh_autocast_casts()
                outs.append(net(torch.randn(4, 16, requires_grad=True)))   # a stage input
    assert all(o.requires_grad for o in outs)
    return len(ptrs)


def test_each_micro_batch_in_flight_saves_its_own_weight_casts():
    # the runtime casts anew per micro-batch (a correctness fix: test_memory_autocast_grads.py),
    # so two micro-batches in flight hold two bf16 copies of every linear weight
    assert _saved_bf16_weight_copies(fresh=True) == 4
    assert _saved_bf16_weight_copies(fresh=False) == 2   # autocast's cache alone: one set


def test_fsdp2_keeps_the_previous_rows_reduce_scatter_input_while_the_next_row_runs_backward():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from autopar.runtime.faults.dist import ensure_initialized
    ensure_initialized(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 32), nn.Linear(32, 8))
    mesh = init_device_mesh("cpu", (1,))
    for lin in net:
        fully_shard(lin, mesh=mesh, reshard_after_forward=True)
    fully_shard(net, mesh=mesh, reshard_after_forward=True)
    state, seen = fully_shard.state(net), []

    def held():
        return [s.reduce_scatter_input.numel() for s in state._comm_ctx.reduce_scatter_states]

    for i, lin in enumerate(net):   # a hook on row i's output runs as row i's backward starts
        lin.register_forward_hook(lambda m, a, out, i=i: out.register_hook(
            lambda g: seen.append((i, held()))) and None)
    sizes = [sum(p.numel() for p in lin.parameters()) for lin in net]
    for _ in range(2):   # what ShardedGradStage sets before every micro-batch's backward
        seen.clear()
        net.set_is_last_backward(False)
        net.set_requires_gradient_sync(True)
        net(torch.randn(4, 16)).sum().backward()
    # micro-batch 2: row 0's input from micro-batch 1 is still held when row 2 starts, and each
    # row's backward runs beside the previous row's whole reduce-scatter input
    assert seen == [(2, [sizes[0]]), (1, [sizes[2]]), (0, [sizes[1]])]
    assert held() == [sizes[0]]   # kept past the backward (no last backward yet)


def _stage_peaks(plan):
    """(each pipeline rank's predicted peak bytes, its rows) for ``plan`` on SPEC, amp."""
    from autopar.trace.driver import table_for
    from costmodels.model.estimate import estimate
    e = estimate(table_for(SPEC), "cpu-2core", plan, 4, 8, precision="amp")
    return [s["memory_bytes"]["total"] for s in e.stages_detail], [tuple(s["rows"][0]) for s in e.stages_detail]


@pytest.mark.parametrize("zero", [1, 3])
def test_the_amp_estimate_charges_in_flight_casts_and_the_reduce_window_under_pp(zero, monkeypatch):
    from autopar.trace.driver import table_for
    from costmodels.contracts.plan import Plan
    from costmodels.model import pipeline_backward_memory as pbm
    from costmodels.model.table_arrays import table_arrays
    plan = Plan(dp=2, pp=2, zero=zero, micro_batch_size=1, schedule="1f1b")   # m = 4
    new, rows = _stage_peaks(plan)
    with monkeypatch.context() as mp:
        mp.setattr(pbm, "cast_copies_bytes", lambda *a, **k: 0.0)
        mp.setattr(pbm, "reduce_window_bytes", lambda *a, **k: 0.0)
        old, _ = _stage_peaks(plan)
        one = _stage_peaks(Plan(dp=4, zero=zero))
    assert _stage_peaks(Plan(dp=4, zero=zero)) == one   # pp = 1: nothing charged
    arr = table_arrays(table_for(SPEC))
    casts0 = 2.0 * pbm.cast_rows_params(arr, rows[0], 1)   # stage 0: 2 in flight under 1F1B
    window = [pbm.reduce_window_bytes(arr, [ch], 1, 2, zero, 2, 4.0) for ch in rows]
    assert (window[0] > 0) == (zero >= 2)
    assert new[0] >= old[0] + casts0 + window[0] - 1.0
    assert new[1] >= old[1] + window[1] - 1.0   # stage 1: one micro-batch in flight, no extra casts
    if zero < 2:
        assert new[1] == old[1]
