"""Data parallelism and ZeRO over the plan's dp dimension (the table in
``autopar.runtime.apply``'s docstring says what runs for each ``zero``).

Kept apart from the Runner because each ZeRO stage is its own mechanism — DDP, an optimizer-state
partition with a post-step broadcast, FSDP2 — and the gradient all-reduce an interleaved pipeline
needs instead of DDP's reducer.
"""
from __future__ import annotations

import warnings
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from autopar.runtime import dist as adist
from autopar.runtime.rows import StageModule
from costmodels.plan import Plan


def syncs_after_step(plan: Plan) -> bool:
    """Zero 0/1 with several chunks per rank: DDP's reducer cannot follow the interleaved order,
    so gradients are all-reduced in buckets right after the pipeline step instead."""
    return plan.dp > 1 and plan.zero < 2 and plan.pp > 1 and plan.vpp > 1


def wrap_dp(stage: StageModule, plan: Plan, layout: adist.Layout, device: torch.device) -> nn.Module:
    """``stage`` under the plan's data parallelism: DDP (zero 0/1), FSDP2 per block and per stage
    (zero 2/3), or itself (dp=1, or gradients synced after the step)."""
    if plan.dp == 1 or syncs_after_step(plan):
        return stage
    if plan.zero >= 2:
        from torch.distributed.fsdp import fully_shard
        mesh = layout.dim_mesh("dp", device.type)
        reshard = plan.zero == 3
        for row, kind in zip(stage.rows, stage.kinds):
            if kind == "block":
                fully_shard(row, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(stage, mesh=mesh, reshard_after_forward=reshard)
        return stage
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [device.index] if device.type == "cuda" else None
    with warnings.catch_warnings():  # buffers are identical on every rank: never sync them
        warnings.simplefilter("ignore", FutureWarning)
        return DDP(stage, process_group=layout.group("dp"), device_ids=ids,
                   broadcast_buffers=False, init_sync=False)


class Zero1:
    """Optimizer-state sharding as ``ZeroRedundancyOptimizer`` does it: each parameter is owned
    by one dp rank (greedy size-balanced partition); ``owned`` is what this rank's optimizer
    sees, and after an optimizer over exactly owned parameters steps, each owner broadcasts its
    parameters to the other dp ranks."""

    def __init__(self, params: list[nn.Parameter], dp_rank: int, dp: int, layout: adist.Layout):
        self.dp_rank, self.dp, self.layout = dp_rank, dp, layout
        if len(params) < dp:  # too few tensors to give each dp rank one: keep state replicated
            self.owner, self.owned = [], params
            return
        load = [0] * dp
        order = sorted(range(len(params)), key=lambda i: (-params[i].numel(), i))
        owner = [0] * len(params)
        for i in order:
            r = min(range(dp), key=lambda k: (load[k], k))
            owner[i] = r
            load[r] += params[i].numel()
        self.owner = list(zip(params, owner))
        self.owned = [p for p, r in self.owner if r == dp_rank]
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
        g = self.layout.group("dp")
        with torch.no_grad():
            for r in range(self.dp):
                mine = [p for p, o in self.owner if o == r]
                if not mine:
                    continue
                flat = _flatten_dense_tensors([p.data for p in mine])
                dist.broadcast(flat, src=self.layout.rank_at(dp=r), group=g)
                if r != self.dp_rank:
                    for p, new in zip(mine, _unflatten_dense_tensors(flat, [p.data for p in mine])):
                        p.data.copy_(new)
                        p.grad = None


def bucketed_mean(params, group, size: int, bucket_bytes: int = 25 << 20) -> None:
    """Average ``params``' gradients over ``group``: flattened into ~25 MB buckets, all-reduces
    issued asynchronously and waited for together."""
    grads = [p.grad for p in params if p.grad is not None]
    buckets, cur, cur_bytes = [], [], 0
    for g in grads:
        cur.append(g)
        cur_bytes += g.numel() * g.element_size()
        if cur_bytes >= bucket_bytes:
            buckets.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        buckets.append(cur)
    pending = []
    for b in buckets:
        flat = _flatten_dense_tensors(b)
        pending.append((b, flat, dist.all_reduce(flat, group=group, async_op=True)))
    for b, flat, work in pending:
        work.wait()
        flat /= size
        for g, new in zip(b, _unflatten_dense_tensors(flat, b)):
            g.copy_(new)

