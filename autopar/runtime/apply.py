"""``autopar.apply(model, plan, loss_fn=...)`` → a Runner that trains ``model`` under ``plan``.

What runs where (see also the README section "runtime / verify"):

* **Process groups.** ``apply`` starts the default group from torchrun's environment when none
  exists (gloo on CPU, NCCL on GPU, collectives time out after ``AUTOPAR_COLLECTIVE_TIMEOUT``
  seconds, default 300). The plan's ranks form a DeviceMesh ordered by ``plan.placement``
  (``autopar.runtime.dist``).
* **Rows and stages.** The model is cut into the layer table's rows (``autopar.runtime.rows``);
  virtual stage ``v`` runs rows ``plan.stages[v]`` on pipeline rank ``v % pp``. Without
  ``stages`` the split is ``costmodels.split.balanced_stages`` of the layer table (when the
  trace is at hand via ``spec=``/``table=``), else the same partition over a FLOP proxy.
* **Tensor / sequence parallel, recompute**: each row of this rank goes through
  ``autopar.rewrite.rewrite_row`` (identity for tp=1 and recompute "none").
* **Pipeline**: ``torch.distributed.pipelining`` ``PipelineStage`` per local virtual stage, run
  by ``ScheduleGPipe`` / ``Schedule1F1B`` / ``ScheduleInterleaved1F1B``. A parameter used by
  stages on different pipeline ranks (a tied embedding and LM head) is one copy per rank whose
  gradients are all-reduced between those ranks after backward (Megatron's embedding group).
* **Data parallel / ZeRO** (over the dp dimension of the mesh):

  ====== ===============================================================================
  zero   what runs
  ====== ===============================================================================
  0      ``DistributedDataParallel``: bucketed gradient all-reduce overlapped with backward
  1      DDP for gradients + optimizer-state sharding as ``ZeroRedundancyOptimizer`` does it:
         ``runner.parameters()`` yields only the parameters this dp rank owns (greedy
         size-balanced partition), so the user's own optimizer keeps state for those only;
         after its ``step()`` an optimizer post-step hook broadcasts each owner's
         parameters to the other dp ranks
  2      FSDP2 ``fully_shard(reshard_after_forward=False)`` per block and per stage: gradients
         reduce-scattered, optimizer state and gradients sharded, parameters gathered once
         per step and kept through backward
  3      FSDP2 ``fully_shard(reshard_after_forward=True)``: as 2, and parameters re-sharded
         after forward and gathered again for backward
  ====== ===============================================================================

``train_step(inputs, targets)`` takes this dp rank's share of the global batch, runs all
micro-batches (``micro_batch_size`` samples each) and returns the global mean loss, a float on
every rank, equal to the serial model's mean loss over the global batch when ``loss_fn`` returns a
mean over its micro-batch.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.runtime import dist as adist
from autopar.runtime.rows import Rows, StageModule, model_rows, row_weights
from costmodels.errors import PlanError
from costmodels.plan import Plan
from costmodels.split import partition


def apply(model: nn.Module, plan, loss_fn: Callable | None = None, *, spec: str | None = None,
          table=None, group=None, timeout_s: float | None = None) -> "Runner":
    """Rewrite ``model`` for ``plan`` and return a Runner (see the module docstring).

    ``model`` must be built identically on every rank (same seed). ``plan`` is a Plan, a dict, a
    JSON string or a path (``Plan.load``). ``loss_fn(output, targets)`` defaults to autopar's
    token loss (cross-entropy / MSE). ``spec``/``table``: the model spec or layer table used for
    the balanced split when the plan has no ``stages``. ``group``: run on the ranks of this
    process group instead of the whole world.
    """
    if not isinstance(plan, Plan):
        plan = Plan.from_dict(plan) if isinstance(plan, dict) else Plan.load(str(plan))
    if group is None:
        adist.ensure_initialized(plan.world_size, timeout_s)
    elif not dist.is_initialized():
        raise PlanError("apply(group=...) needs torch.distributed to be initialised first")
    if loss_fn is None:
        from autopar.models.source import token_loss
        loss_fn = token_loss
    return Runner(model, plan, loss_fn, spec=spec, table=table, pg=group)


class Runner:
    def __init__(self, model: nn.Module, plan: Plan, loss_fn: Callable, *, spec=None, table=None,
                 pg=None):
        self.plan = plan
        self.loss_fn = loss_fn
        self.layout = lay = adist.make_layout(plan, pg)
        self.device = adist.device_for_backend()
        self.rank = lay.rank
        self.dp_rank, self.dp_size = lay.dp_rank, plan.dp
        self.tp_rank, self.tp_size = lay.tp_rank, plan.tp
        self.pp_rank, self.pp_size = lay.pp_rank, plan.pp
        self._keys = [k for k in model.state_dict(keep_vars=True)]
        key_of = {}
        for k, t in model.state_dict(keep_vars=True).items():
            key_of.setdefault(id(t), []).append(k)

        rows = model_rows(model)
        self.stages_rows = _stage_ranges(plan, rows, spec, table)
        n_virtual = plan.virtual_stages
        self.virtual = [v for v in range(n_virtual) if v % plan.pp == lay.pp_rank]
        self.first_virtual, self.last_virtual = 0, n_virtual - 1

        # parameters used by stages on more than one pipeline rank (tied embedding / head)
        users: dict[int, set[int]] = {}
        for v, (a, b) in enumerate(self.stages_rows):
            for m in rows.modules[a:b]:
                for p in m.parameters():
                    users.setdefault(id(p), set()).add(v % plan.pp)

        # this rank's stage modules (rows rewritten for tp / sp / recompute)
        self._raw: list[StageModule] = []
        for v in self.virtual:
            a, b = self.stages_rows[v]
            mods = [self._rewrite(rows.modules[i], rows.kinds[i]) for i in range(a, b)]
            self._raw.append(StageModule(mods, rows.kinds[a:b]).to(self.device))

        # names: stage-local name -> the serial model's state_dict keys
        self._names: list[dict[str, list[str]]] = []
        self._tied: list[tuple[int, str, object]] = []   # (local stage, name, group)
        for s, stage in enumerate(self._raw):
            names = {}
            for n, t in list(stage.named_parameters(remove_duplicate=False)) + \
                    list(stage.named_buffers(remove_duplicate=False)):
                keys = key_of.get(id(t))
                if keys:
                    names[n] = keys
            self._names.append(names)
            seen = set()
            for n, p in stage.named_parameters():
                ranks = users.get(id(p), set())
                if len(ranks) > 1 and id(p) not in seen:
                    seen.add(id(p))
                    peers = [lay.rank_at(pp=r) for r in sorted(ranks)]
                    self._tied.append((s, n, adist.group(peers)))
        del model, rows  # the rows this rank does not run are freed with the model

        self._owned: list[nn.Parameter] | None = None
        self._wrapped = [self._wrap_dp(s) for s in self._raw]
        self._pipe_stages = None
        self._schedules: dict[int, object] = {}
        if plan.pp > 1:
            from torch.distributed.pipelining import PipelineStage
            pp_group = lay.group("pp")
            self._pipe_stages = [PipelineStage(w, v, n_virtual, self.device, group=pp_group)
                                 for w, v in zip(self._wrapped, self.virtual)]

    # ---- construction helpers ---------------------------------------------------------
    def _rewrite(self, module: nn.Module, kind: str) -> nn.Module:
        p = self.plan
        if p.tp == 1 and not p.sequence_parallel and p.recompute == "none":
            return module
        try:
            from autopar.rewrite import rewrite_row
        except ImportError:
            raise PlanError("this plan needs tensor parallel / sequence parallel / recompute "
                            "(autopar.rewrite), which this autopar does not have yet; use tp=1, "
                            "sequence_parallel=false, recompute='none'") from None
        return rewrite_row(module, kind=kind, tp_rank=self.tp_rank, tp_size=p.tp,
                           tp_group=self.layout.group("tp") if p.tp > 1 else None,
                           sequence_parallel=p.sequence_parallel, recompute=p.recompute)

    def _wrap_dp(self, stage: StageModule) -> nn.Module:
        p = self.plan
        if p.dp == 1:
            return stage
        if p.zero >= 2:
            from torch.distributed.fsdp import fully_shard
            mesh = self.layout.dim_mesh("dp", self.device.type)
            reshard = p.zero == 3
            for row, kind in zip(stage.rows, stage.kinds):
                if kind == "block":
                    fully_shard(row, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(stage, mesh=mesh, reshard_after_forward=reshard)
            return stage
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [self.device.index] if self.device.type == "cuda" else None
        with warnings.catch_warnings():  # buffers are identical on every rank: never sync them
            warnings.simplefilter("ignore", FutureWarning)
            return DDP(stage, process_group=self.layout.group("dp"), device_ids=ids,
                       broadcast_buffers=False, init_sync=False)

    # ---- public API -------------------------------------------------------------------
    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters for the user's optimizer (ZeRO-1: only those it owns; ZeRO-2/3:
        FSDP2's sharded DTensor parameters)."""
        if self.plan.zero == 1 and self.plan.dp > 1:
            if self._owned is None:
                self._setup_zero1()
            return list(self._owned)
        return self._all_params()

    def named_parameters(self):
        for s, stage in enumerate(self._raw):
            for n, p in stage.named_parameters():
                yield self._names[s].get(n, [n])[0], p

    def _all_params(self) -> list[nn.Parameter]:
        seen, out = set(), []
        for stage in self._raw:
            for p in stage.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def train_step(self, inputs, targets=None) -> float:
        """Forward and backward over this dp rank's batch (``global_batch / dp`` samples) under
        the plan's schedule; returns the global mean loss on every rank."""
        plan = self.plan
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        inputs = tuple(t.to(self.device) for t in inputs)
        if targets is not None:
            targets = targets.to(self.device)
        batch = inputs[0].size(0)
        if batch % plan.micro_batch_size:
            raise PlanError(f"this dp rank's batch of {batch} samples is not divisible by plan "
                            f"field 'micro_batch_size'={plan.micro_batch_size}; pass global_batch/dp "
                            "samples per rank with global_batch divisible by dp·micro_batch_size")
        n_micro = batch // plan.micro_batch_size
        if plan.pp == 1:
            local = self._run_local(inputs, targets, n_micro)
        else:
            local = self._run_pipeline(inputs, targets, n_micro)
            for s, name, g in self._tied:
                grad = self._raw[s].get_parameter(name).grad
                if grad is not None:
                    dist.all_reduce(_local(grad), group=g)
        t = torch.tensor([local], dtype=torch.float64, device=self.device)
        if plan.pp > 1:
            dist.all_reduce(t, group=self.layout.group("pp"))
        if plan.dp > 1:
            dist.all_reduce(t, group=self.layout.group("dp"))
            t /= plan.dp
        return float(t.item())

    def _run_local(self, inputs, targets, n_micro: int) -> float:
        module = self._wrapped[0]
        fsdp = _is_fsdp(module)
        mbs = self.plan.micro_batch_size
        total = 0.0
        for i in range(n_micro):
            last = i == n_micro - 1
            sl = slice(i * mbs, (i + 1) * mbs)
            if fsdp:
                module.set_requires_gradient_sync(last)
                ctx = contextlib.nullcontext()
            elif hasattr(module, "no_sync") and not last:
                ctx = module.no_sync()
            else:
                ctx = contextlib.nullcontext()
            with ctx:
                out = module(*(t[sl] for t in inputs))
                loss = self.loss_fn(out, targets[sl] if targets is not None else None)
                (loss / n_micro).backward()
            total += float(loss.detach())
        return total / n_micro

    def _run_pipeline(self, inputs, targets, n_micro: int) -> float:
        sched = self._schedule(n_micro)
        args, kwargs, losses = (), {}, []
        if self.first_virtual in self.virtual:
            args = inputs
        if self.last_virtual in self.virtual:
            kwargs = dict(target=targets, losses=losses)
        sched.step(*args, **kwargs)
        if not losses:
            return 0.0
        return float(sum(float(x.detach()) for x in losses) / len(losses))

    def _schedule(self, n_micro: int):
        if n_micro not in self._schedules:
            from torch.distributed import pipelining as pl
            plan = self.plan
            if n_micro < plan.pp:
                raise PlanError(f"{n_micro} micro-batches per step for pp={plan.pp}: a pipeline "
                                "needs at least pp micro-batches; raise the global batch or lower "
                                "'micro_batch_size'")
            loss = self.loss_fn
            if plan.schedule == "interleaved-1f1b":
                rounds = max(1, n_micro // plan.pp)
                if n_micro % rounds:
                    raise PlanError(f"{n_micro} micro-batches do not fit the interleaved 1F1B "
                                    f"schedule with pp={plan.pp} (needs a multiple of pp); change "
                                    "the global batch or 'micro_batch_size'")
                sched = pl.ScheduleInterleaved1F1B(self._pipe_stages, n_micro, loss_fn=loss)
            else:
                cls = pl.ScheduleGPipe if plan.schedule == "gpipe" else pl.Schedule1F1B
                sched = cls(self._pipe_stages[0], n_micro, loss_fn=loss)
            self._schedules[n_micro] = sched
        return self._schedules[n_micro]

    # ---- ZeRO-1 -----------------------------------------------------------------------
    def _setup_zero1(self) -> None:
        params = self._all_params()
        dp = self.plan.dp
        if len(params) < dp:
            raise PlanError(f"zero=1 with dp={dp} needs at least {dp} parameter tensors per "
                            f"rank, this rank has {len(params)}; use zero=0 or 2")
        load = [0] * dp
        order = sorted(range(len(params)), key=lambda i: (-params[i].numel(), i))
        owner = [0] * len(params)
        for i in order:
            r = min(range(dp), key=lambda k: (load[k], k))
            owner[i] = r
            load[r] += params[i].numel()
        self._owner = list(zip(params, owner))
        self._owned = [p for p, r in self._owner if r == self.dp_rank]
        owned_ids = {id(p) for p in self._owned}
        me = weakref.ref(self)

        def hook(opt, args, kwargs):
            runner = me()
            if runner is None:
                return
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            if ids and ids <= owned_ids:
                runner._zero1_broadcast()

        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._hook = register_optimizer_step_post_hook(hook)

    def _zero1_broadcast(self) -> None:
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        g = self.layout.group("dp")
        with torch.no_grad():
            for r in range(self.plan.dp):
                mine = [p for p, o in self._owner if o == r]
                if not mine:
                    continue
                flat = _flatten_dense_tensors([p.data for p in mine])
                dist.broadcast(flat, src=self.layout.rank_at(dp=r), group=g)
                if r != self.dp_rank:
                    for p, new in zip(mine, _unflatten_dense_tensors(flat, [p.data for p in mine])):
                        p.data.copy_(new)
                        p.grad = None

    # ---- checkpoints ------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The serial model's state dict (same keys), gathered on the first rank of the plan;
        None on the others. Every rank of the plan must call it."""
        lay = self.layout
        part: dict[str, torch.Tensor] = {}
        for s, stage in enumerate(self._raw):
            items = list(stage.named_parameters(remove_duplicate=False)) + \
                list(stage.named_buffers(remove_duplicate=False))
            for n, t in items:
                if n not in self._names[s]:
                    continue
                t = t.detach()
                if hasattr(t, "full_tensor"):
                    t = t.full_tensor()
                for k in self._names[s][n]:
                    part[k] = t.cpu().clone()
        if lay.dp_rank or lay.tp_rank:
            part = {}
        g = adist.group(lay.ranks)
        dst = lay.ranks[0]
        gathered = [None] * len(lay.ranks) if self.rank == dst else None
        if len(lay.ranks) == 1:
            gathered = [part]
        else:
            dist.gather_object(part, gathered, dst=dst, group=g)
        if self.rank != dst:
            return None
        merged = {}
        for d in gathered:
            merged.update(d)
        return {k: merged[k] for k in self._keys if k in merged}

    def __repr__(self) -> str:
        return (f"Runner(rank={self.rank}, dp={self.dp_rank}/{self.dp_size}, "
                f"tp={self.tp_rank}/{self.tp_size}, pp={self.pp_rank}/{self.pp_size}, "
                f"virtual_stages={self.virtual}, rows={[self.stages_rows[v] for v in self.virtual]})")


def _stage_ranges(plan: Plan, rows: Rows, spec, table) -> tuple[tuple[int, int], ...]:
    n, v = len(rows), plan.virtual_stages
    if v > n:
        raise PlanError(f"plan fields 'pp'·'vpp' = {plan.pp}·{plan.vpp} = {v} pipeline stages but "
                        f"the model has only {n} rows (embedding, {n - 2} blocks, head); lower pp "
                        "or vpp")
    if plan.stages is not None:
        if plan.stages[-1][1] != n:
            raise PlanError(f"plan field 'stages' ends at row {plan.stages[-1][1]} but the model "
                            f"has {n} rows (embedding, {n - 2} blocks, head); the last range must "
                            f"end at {n}")
        return plan.stages
    if table is None and spec is not None:
        try:
            from autopar.trace import table_for
            table = table_for(spec, micro_batch=plan.micro_batch_size)
        except ImportError:
            table = None
    if table is not None and len(table.rows) == n:
        from costmodels.split import balanced_stages
        return balanced_stages(table, v)
    return partition(row_weights(rows), v)


def _is_fsdp(module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(module, FSDPModule)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def serial_losses(model: nn.Module, loss_fn: Callable, batches: Sequence, make_opt) -> list[float]:
    """Reference: the single-process model on each global batch, one optimizer step each."""
    opt = make_opt(model.parameters())
    out = []
    for inputs, targets in batches:
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        loss = loss_fn(model(*inputs), targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(float(loss.detach()))
    return out
