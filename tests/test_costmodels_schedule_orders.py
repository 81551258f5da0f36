"""The simulator's per-rank orders (costmodels.model.schedule_orders) are torch 2.13's own: for each
split-backward schedule and several (pp, m), torch's ``_calculate_single_rank_operations`` —
the function its constructor fills ``pipeline_order`` with — is called on a stand-in object
holding the attributes it reads (no process group, no stages), and its actions, with the
idle slots (None) dropped, must equal ours op for op: kind, stage, micro-batch, and the grouping
of DualPipeV's overlapped forward + backward."""
from types import SimpleNamespace

import pytest
import torch.distributed.pipelining._utils as pipelining_utils
import torch.distributed.pipelining.schedules as pipelining

from costmodels.contracts.plan import stages_of_rank
from costmodels.model.schedule_orders import rank_actions, rounds_of
from costmodels.model.schedule_sim import stage_order

KIND = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W", "FULL_BACKWARD": "BW"}
CLASSES = {"interleaved-zb": pipelining.ScheduleInterleavedZeroBubble,
           "zb-v": pipelining.ScheduleZBVZeroBubble,
           "dualpipe-v": pipelining.ScheduleDualPipeV}


def torch_order(schedule, pp, vpp, m):
    """torch's per-rank actions as tuples of (kind, stage, micro_batch), idle slots dropped."""
    cls = CLASSES[schedule]
    self = SimpleNamespace(pp_group_size=pp, n_local_stages=vpp, _n_microbatches=m,
                           num_stages=pp * vpp)
    if schedule == "interleaved-zb":
        self.microbatches_per_round = rounds_of(pp, m)[1]
    order = {r: cls._calculate_single_rank_operations(self, r) for r in range(pp)}
    if schedule == "interleaved-zb":   # the constructor's second pass (it inserts idle slots)
        self.pipeline_order = order
        order = cls._add_bubbles_to_actions(self, pp * vpp)
    out = {}
    for r in range(pp):
        actions = []
        for a in order[r]:
            if a is None:
                continue
            subs = a.sub_actions if a.sub_actions is not None else (a,)
            actions.append(tuple((KIND[s.computation_type.name], s.stage_index, s.microbatch_index)
                                 for s in subs))
        out[r] = actions
    return out


CASES = [("interleaved-zb", pp, vpp, m) for pp, vpp, m in
         [(2, 2, 2), (2, 2, 4), (2, 3, 6), (4, 2, 4), (4, 2, 8), (4, 3, 12), (3, 2, 9), (4, 2, 6),
          (8, 2, 16)]]
CASES += [("zb-v", pp, 2, m) for pp, m in [(2, 1), (2, 2), (2, 5), (3, 4), (4, 4), (4, 7), (4, 16), (8, 9)]]
CASES += [("dualpipe-v", pp, 2, m) for pp, m in [(2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (8, 16)]]


@pytest.mark.parametrize("schedule,pp,vpp,m", CASES)
def test_orders_equal_torchs(schedule, pp, vpp, m):
    theirs = torch_order(schedule, pp, vpp, m)
    for r in range(pp):
        ours = rank_actions(schedule, pp, vpp, m, r)
        assert ours == theirs[r], (schedule, pp, m, r)
        # every op of every stage the rank holds, each micro-batch once per kind
        stages = stages_of_rank(schedule, pp, vpp, r)
        flat = [op for a in ours for op in a]
        for s in stages:
            fwd = sorted(mb for k, st, mb in flat if k == "F" and st == s)
            assert fwd == list(range(m))
            grads = sorted(mb for k, st, mb in flat if k in ("B", "BW") and st == s)
            assert grads == list(range(m))


def test_torch_v_mapping_is_ours():
    for pp in (2, 3, 4, 8):
        theirs = pipelining_utils.generate_rank_to_stage_mapping(pp, 2 * pp, style="v")
        for r in range(pp):
            assert tuple(theirs[r]) == stages_of_rank("zb-v", pp, 2, r) == stages_of_rank("dualpipe-v", pp, 2, r)
        loop = pipelining_utils.generate_rank_to_stage_mapping(pp, 3 * pp, style="loop")
        assert all(tuple(loop[r]) == stages_of_rank("interleaved-zb", pp, 3, r) for r in range(pp))


def test_stage_order_flattens_with_local_chunks():
    order = stage_order("dualpipe-v", 2, 2, 4, 0)
    assert {c for _, c, _ in order} == {0, 1}
    assert [k for k, _, _ in order].count("F") == 8
