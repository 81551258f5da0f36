"""Data parallelism and ZeRO over the plan's dp dimension (the table in
``autopar.runtime.apply``'s docstring says what runs for each ``zero``).

Kept apart from the Runner because each ZeRO stage is its own mechanism — DDP, an optimizer-state
partition with a post-step broadcast, FSDP2 — and DDP under torch's pipeline stages needs one
setting that only makes sense with the reason beside it (``wrap_dp``).
"""
from __future__ import annotations

import warnings
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from autopar.runtime.assemble.rows import StageModule
from autopar.runtime.faults import dist as adist
from autopar.runtime.faults.failures import peer_failures
from autopar.runtime.faults.sync_groups import sync_group, sync_mesh
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, Plan


def wrap_dp(stage: StageModule, plan: Plan, layout: adist.Layout, device: torch.device) -> nn.Module:
    """``stage`` under the plan's data parallelism: DDP (zero 0/1), FSDP2 per block and per stage
    (zero 2/3), or itself (dp=1).

    DDP under a pipeline (pp > 1): torch's ``PipelineStage`` owns the sync switch. It runs every
    micro-batch's forward and all backwards but the last under ``no_sync``, and before the last
    backward calls ``reducer.prepare_for_backward`` itself, so that backward overlaps DDP's
    bucketed all-reduce (what the cost model prices). But on its first step the stage also runs
    the module once *outside* ``no_sync`` to infer activation shapes; DDP's forward then arms
    the reducer (``prepare_for_backward`` in ``_post_forward``), the shape probe's backward
    never fires the parameter hooks, and the first real backward — under ``no_sync``, which
    does not disarm hooks already armed — marks every parameter ready and records it for the
    bucket rebuild; the last backward records them all again: 2·N recorded parameters against
    N, torch's "rebuilt parameter indices size is not same as original model parameters size"
    at the next forward (whenever a non-last backward follows the probe with no forward in
    between: GPipe at m >= 2, 1F1B at m = pp on the first stage). So DDP's forward is told to
    never prepare the reducer (``require_backward_grad_sync = False``, what ``no_sync`` sets):
    the stage's own ``prepare_for_backward`` before the last backward is then the only one,
    for every schedule, interleaved included (each local chunk is its own DDP whose last
    backward reduces its buckets)."""
    if plan.dp * plan.cp == 1 or reduces_after_step(plan):
        return stage
    if plan.zero >= 2:
        from torch.distributed.fsdp import FSDPModule, fully_shard
        mesh = fsdp_mesh(layout, plan, device.type)
        reshard = plan.zero == 3
        # expert shards differ per ep rank: FSDP2 leaves them whole (step/experts.py reduces them)
        from autopar.runtime.step.experts import expert_param_names
        experts = {stage.get_parameter(n) for n in expert_param_names(stage)} or None
        for row, kind in zip(stage.rows, stage.kinds):
            if kind == "block" and not isinstance(row, FSDPModule):  # a meta build shards early
                fully_shard(row, mesh=mesh, reshard_after_forward=reshard, ignored_params=experts)
        fully_shard(stage, mesh=mesh, reshard_after_forward=reshard, ignored_params=experts)
        return stage
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [device.index] if device.type == "cuda" else None
    from autopar.runtime.step.experts import expert_param_names
    ignored = expert_param_names(stage)   # expert shards differ per ep rank (step/experts.py)
    if ignored:
        DDP._set_params_and_buffers_to_ignore_for_model(stage, ignored)
    with warnings.catch_warnings():  # buffers are identical on every rank: never sync them
        warnings.simplefilter("ignore", FutureWarning)
        ddp = DDP(stage, process_group=sync_group(layout), device_ids=ids,
                  broadcast_buffers=False, init_sync=False)
    if plan.pp > 1:
        ddp.require_backward_grad_sync = False   # the pipeline stage alone arms the reducer
    return ddp


def reduces_after_step(plan: Plan) -> bool:
    """Whether the dp gradients are all-reduced after the pipeline step (``all_reduce_grads``)
    instead of by DDP: ZeRO 0/1 under a split-backward schedule (``interleaved-zb``, ``zb-v``,
    ``dualpipe-v``). Those compute weight gradients with ``torch.autograd.grad`` (torch's
    ``stage_backward_weight``) and write ``.grad`` themselves, so DDP's gradient hooks never fire:
    its reducer would all-reduce nothing (or fail, "mark a variable ready only once", on the
    first stage, whose weight pass is a plain backward). FSDP2 (ZeRO-2) has its own path in
    torch's schedule (``REDUCE_GRAD``) and is kept."""
    return (plan.dp * plan.cp > 1 and plan.pp > 1 and plan.zero < 2
            and plan.schedule in SPLIT_BACKWARD_SCHEDULES)


def all_reduce_grads(stages, layout: adist.Layout, dp: int, bucket_bytes: int = 25 << 20) -> None:
    """Average the gradients of ``stages``' parameters (each once) over the dp·cp sync group
    (``dp``: its size), in
    flattened buckets of about ``bucket_bytes`` per dtype (DDP's bucket size): what DDP does,
    after the step rather than overlapped with the last backward."""
    seen, by_kind = set(), {}
    for stage in stages:
        for p in stage.parameters():
            if id(p) not in seen and p.grad is not None:
                seen.add(id(p))
                by_kind.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    group = sync_group(layout)
    for grads in by_kind.values():
        bucket, size = [], 0
        for i, g in enumerate(grads):
            bucket.append(g)
            size += g.numel() * g.element_size()
            if size >= bucket_bytes or i == len(grads) - 1:
                flat = _flatten_dense_tensors(bucket)
                dist.all_reduce(flat, group=group)
                flat /= dp
                for g_, new in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    g_.copy_(new)
                bucket, size = [], 0


def fsdp_mesh(layout: adist.Layout, plan: Plan, device_type: str):
    """The mesh FSDP2 shards over: the dp dimension, or with cp / HSDP the dp·cp sync group
    (2-D replicate × shard under HSDP; ``autopar.runtime.faults.sync_groups``)."""
    if plan.cp > 1 or plan.dp_shard:
        return sync_mesh(layout, plan, device_type)
    return layout.dim_mesh("dp", device_type)


class Zero1:
    """Optimizer-state sharding as ``ZeroRedundancyOptimizer`` does it: each parameter is owned
    by one rank of the shard group ``peers`` (the dp·cp ranks; under HSDP the replica's shard
    group, gradients being all-reduced over every replica by DDP first) by a greedy
    size-balanced partition; ``owned`` is what this rank's optimizer sees, and after an
    optimizer over exactly owned parameters steps, each owner broadcasts its parameters to the
    other ranks of the shard group."""

    def __init__(self, params: list[nn.Parameter], peers: list[int], layout: adist.Layout, private=()):
        self.peers = list(peers)
        dp_rank, dp = self.peers.index(layout.rank), len(self.peers)
        self.dp_rank, self.dp, self.layout = dp_rank, dp, layout
        private = list(private)   # this rank's own (expert shards): stepped here, never broadcast
        if len(params) < dp:  # too few tensors to give each dp rank one: keep state replicated
            self.owner, self.owned = [], params + private
            return
        load = [0] * dp
        order = sorted(range(len(params)), key=lambda i: (-params[i].numel(), i))
        owner = [0] * len(params)
        for i in order:
            r = min(range(dp), key=lambda k: (load[k], k))
            owner[i] = r
            load[r] += params[i].numel()
        self.owner = list(zip(params, owner))
        self.owned = [p for p, r in self.owner if r == dp_rank] + private
        owned_ids = {id(p) for p in self.owned}
        me = weakref.ref(self)  # the hook is global: it must not keep this alive

        def hook(opt, args, kwargs):
            zero1 = me()
            if zero1 is None:
                return
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            if ids and ids <= owned_ids:
                zero1.broadcast()

        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._hook = register_optimizer_step_post_hook(hook)

    def broadcast(self) -> None:
        """Each owner's parameters to the other dp ranks (their stale gradients dropped)."""
        g = adist.group(self.peers)
        lay = self.layout
        with peer_failures("the optimizer step (ZeRO-1 parameter broadcast)", self.peers,
                           lay.rank, adist.timeout_s()), torch.no_grad():
            for r in range(self.dp):
                mine = [p for p, o in self.owner if o == r]
                if not mine:
                    continue
                flat = _flatten_dense_tensors([p.data for p in mine])
                dist.broadcast(flat, src=self.peers[r], group=g)
                if r != self.dp_rank:
                    for p, new in zip(mine, _unflatten_dense_tensors(flat, [p.data for p in mine])):
                        p.data.copy_(new)
                        p.grad = None
