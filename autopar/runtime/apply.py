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

  With an interleaved schedule (several chunks per rank) DDP's reducer cannot follow the chunk
  order, so zero 0/1 gradients are all-reduced in 25 MB buckets right after the pipeline step.

``train_step(inputs, targets)`` takes this dp rank's share of the global batch, runs all
micro-batches (``micro_batch_size`` samples each) and returns the global mean loss, a float on
every rank, equal to the serial model's mean loss over the global batch when ``loss_fn`` returns a
mean over its micro-batch.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.runtime import dist as adist
from autopar.runtime.rows import Rows, StageModule, model_rows, row_weights
from costmodels.errors import PlanError
from costmodels.plan import Plan
from costmodels.split import partition


def apply(model: nn.Module, plan, loss_fn: Callable | None = None, *, spec: str | None = None,
          seq: int | None = None, table=None, example_inputs=None, group=None,
          timeout_s: float | None = None) -> "Runner":
    """Rewrite ``model`` for ``plan`` and return a Runner (see the module docstring).

    ``model`` must be built identically on every rank (same seed). ``plan`` is a Plan, a dict, a
    JSON string or a path (``Plan.load``). ``loss_fn(output, targets)`` defaults to autopar's
    token loss (cross-entropy / MSE). ``spec`` (with ``seq``, its sequence-length override) or
    ``table``: the model spec or layer table used for the balanced split when the plan has no
    ``stages``. ``example_inputs``: the model's inputs
    for one micro-batch (only shapes and dtypes matter; taken from ``spec`` when given), which
    tell the tensor-parallel rewrite each row's input shape. ``group``: run on the ranks of this
    process group instead of the whole world.
    """
    if not isinstance(plan, Plan):
        plan = Plan.from_dict(plan) if isinstance(plan, dict) else Plan.load(str(plan))
    if group is None or timeout_s is not None:
        adist.ensure_initialized(plan.world_size, timeout_s)
    if not dist.is_initialized():
        raise PlanError("apply(group=...) needs torch.distributed to be initialised first")
    if loss_fn is None:
        from autopar.models.source import token_loss
        loss_fn = token_loss
    if example_inputs is None and spec is not None:
        from autopar.models import load_model
        example_inputs = load_model(spec, seq=seq).example_inputs(plan.micro_batch_size, "cpu")
    return Runner(model, plan, loss_fn, spec=spec, seq=seq, table=table,
                  example_inputs=example_inputs, pg=group)


class Runner:
    def __init__(self, model: nn.Module, plan: Plan, loss_fn: Callable, *, spec=None, seq=None,
                 table=None, example_inputs=None, pg=None):
        self.plan = plan
        self.loss_fn = loss_fn
        self.layout = lay = adist.make_layout(plan, pg)
        self.device = adist.device_for_backend()
        self.rank = lay.rank
        self.dp_rank, self.dp_size = lay.dp_rank, plan.dp
        self.tp_rank, self.tp_size = lay.tp_rank, plan.tp
        self.pp_rank, self.pp_size = lay.pp_rank, plan.pp
        sd = model.state_dict(keep_vars=True)
        self._keys = list(sd)
        key_of: dict[int, list[str]] = {}
        for k, t in sd.items():
            key_of.setdefault(id(t), []).append(k)

        rows = model_rows(model)
        self.stages_rows = _stage_ranges(plan, rows, spec, table, seq)
        n_virtual = plan.virtual_stages
        self.virtual = [v for v in range(n_virtual) if v % plan.pp == lay.pp_rank]
        self.first_virtual, self.last_virtual = 0, n_virtual - 1

        # per row: its local tensor names -> the serial model's state-dict keys (all aliases of a
        # tied tensor; the first is canonical); per canonical key: the pipeline ranks using it
        row_keys: list[dict[str, list[str]]] = []
        users: dict[str, set[int]] = {}
        for i, m in enumerate(rows.modules):
            d = {}
            for n, t in _tensors(m):
                if id(t) in key_of:
                    d[n] = key_of[id(t)]
            row_keys.append(d)
        for v, (a, b) in enumerate(self.stages_rows):
            for i in range(a, b):
                for keys in row_keys[i].values():
                    users.setdefault(keys[0], set()).add(v % plan.pp)
        tied_sets = sorted({tuple(sorted(r)) for r in users.values() if len(r) > 1})
        if pg is None or pg is dist.group.WORLD:  # every rank runs apply: create the groups
            extra = [[lay.rank_at(pp=r, dp=d, tp=t) for r in s] for s in tied_sets
                     for d in range(plan.dp) for t in range(plan.tp)]
            adist.create_groups(plan, lay.ranks, extra)

        # this rank's stage modules (rows rewritten for tp / sp / recompute)
        examples = _row_inputs(rows, example_inputs, self.stages_rows, self.virtual)
        self._raw: list[StageModule] = []
        self._names: list[dict[str, list[str]]] = []    # stage-local name -> state-dict keys
        self._shards: list[dict[str, object]] = []      # stage-local name -> rewrite ShardSpec
        for v in self.virtual:
            a, b = self.stages_rows[v]
            mods, names, shards = [], {}, {}
            for j, i in enumerate(range(a, b)):
                r = self._rewrite(rows.modules[i], rows.kinds[i], examples.get(i))
                spec_of = getattr(r, "autopar_shards", None) or {}
                for n, _ in _tensors(r):
                    sh = spec_of.get(n)
                    keys = row_keys[i].get(sh.name if sh is not None else n)
                    if keys:
                        names[f"rows.{j}.{n}"] = keys
                        if sh is not None and getattr(sh, "dim", None) is not None:
                            shards[f"rows.{j}.{n}"] = sh
                mods.append(r)
            self._raw.append(StageModule(mods, rows.kinds[a:b]))
            self._names.append(names)
            self._shards.append(shards)

        # one Parameter per tied tensor on this rank (the rewrite clones what it returns);
        # tied across pipeline ranks: grads all-reduced between them after backward (Megatron)
        first: dict[str, tuple[int, str, nn.Parameter]] = {}
        self._tied: list[tuple[int, str, object]] = []
        for s, stage in enumerate(self._raw):
            for n, p in list(stage.named_parameters(remove_duplicate=False)):
                keys = self._names[s].get(n)
                if not keys:
                    continue
                if keys[0] in first:
                    if first[keys[0]][2] is not p:
                        _set_param(stage, n, first[keys[0]][2])
                    continue
                first[keys[0]] = (s, n, p)
                ranks = users.get(keys[0], set())
                if len(ranks) > 1:
                    peers = [lay.rank_at(pp=r) for r in sorted(ranks)]
                    self._tied.append((s, n, adist.group(peers)))
        for stage in self._raw:
            stage.to(self.device)
        del model, rows, sd, key_of  # rows this rank does not run are freed with the model

        # the plan's DeviceMesh (outer dimension first, per plan.placement; dimensions of size 1
        # left out); FSDP2 gets its 1-D dp slice
        self.mesh = lay.mesh(self.device.type) if plan.world_size > 1 else None
        self._owned: list[nn.Parameter] | None = None
        self._post_sync = False
        self._wrapped = [self._wrap_dp(s) for s in self._raw]
        self._pipe_stages = None
        self._schedules: dict[int, object] = {}
        if plan.pp > 1:
            from torch.distributed.pipelining import PipelineStage
            pp_group = lay.group("pp")
            self._pipe_stages = [PipelineStage(w, v, n_virtual, self.device, group=pp_group)
                                 for w, v in zip(self._wrapped, self.virtual)]

    # ---- construction helpers ---------------------------------------------------------
    def _rewrite(self, module: nn.Module, kind: str, example) -> nn.Module:
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
                           sequence_parallel=p.sequence_parallel, recompute=p.recompute,
                           example_input=example)

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
        if p.pp > 1 and p.vpp > 1:
            # several chunks per rank: DDP's reducer cannot follow the interleaved order, so
            # these grads are all-reduced in buckets right after the pipeline step
            self._post_sync = True
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
            if self._post_sync:
                _bucketed_mean(self._all_params(), self.layout.group("dp"), plan.dp)
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
                try:
                    sched = cls(self._pipe_stages[0], n_micro, loss_fn=loss)
                except ValueError as e:
                    raise PlanError(f"schedule '{plan.schedule}' with pp={plan.pp} cannot run "
                                    f"{n_micro} micro-batch(es) per step ({e}); raise the global "
                                    "batch or lower 'micro_batch_size'") from None
            self._schedules[n_micro] = sched
        return self._schedules[n_micro]

    # ---- ZeRO-1 -----------------------------------------------------------------------
    def _setup_zero1(self) -> None:
        params = self._all_params()
        dp = self.plan.dp
        if len(params) < dp:  # too few tensors to give each dp rank one: keep state replicated
            self._owner, self._owned = [], params
            return
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
        tp_group = lay.group("tp") if self.plan.tp > 1 else None
        for s, stage in enumerate(self._raw):
            for n, t in _tensors(stage):
                keys = self._names[s].get(n)
                if not keys:
                    continue
                t = t.detach()
                if hasattr(t, "full_tensor"):
                    t = t.full_tensor()
                if n in self._shards[s]:
                    t = _tp_full(t, self._shards[s][n], tp_group, self.plan.tp)
                for k in keys:
                    part[k] = t.cpu().clone()
        if lay.dp_rank or lay.tp_rank:
            part = {}
        dst = lay.ranks[0]
        gathered = [None] * len(lay.ranks) if self.rank == dst else None
        if len(lay.ranks) == 1:
            gathered = [part]
        else:
            dist.gather_object(part, gathered, dst=dst, group=adist.group(lay.ranks))
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


def _stage_ranges(plan: Plan, rows: Rows, spec, table, seq=None) -> tuple[tuple[int, int], ...]:
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
            table = table_for(spec, micro_batch=plan.micro_batch_size, seq=seq)
        except ImportError:
            table = None
    if table is not None and len(table.rows) == n:
        from costmodels.split import balanced_stages
        return balanced_stages(table, v)
    return partition(row_weights(rows), v)


def _tensors(module: nn.Module):
    """(name, tensor) for every parameter and persistent buffer, aliases included."""
    out = list(module.named_parameters(remove_duplicate=False))
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for n, b in mod.named_buffers(recurse=False):
            if n not in skip:
                out.append((f"{mod_name}.{n}" if mod_name else n, b))
    return out


def _set_param(root: nn.Module, name: str, p: nn.Parameter) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(owner) if owner else root, leaf, p)


def _bucketed_mean(params, group, size: int, bucket_bytes: int = 25 << 20) -> None:
    """Average ``params``' gradients over ``group``: flattened into ~25 MB buckets, all-reduces
    issued asynchronously and waited for together."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
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


def _tp_full(t: torch.Tensor, shard, group, tp: int) -> torch.Tensor:
    """The full tensor from each tp rank's shard (``shard``: the rewrite's ShardSpec; a fused
    tensor's segments are sharded each on its own)."""
    parts = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(parts, t.contiguous(), group=group)
    dim, segments = shard.dim, getattr(shard, "segments", None)
    if not segments or len(segments) < 2:
        return torch.cat(parts, dim)
    local = [seg // tp for seg in segments]
    split = [p.split(local, dim) for p in parts]
    return torch.cat([torch.cat([sp[k] for sp in split], dim) for k in range(len(local))], dim)


def _row_inputs(rows: Rows, example_inputs, stages, virtual) -> dict:
    """Each row's serial input for one micro-batch, as ``meta`` tensors (shape and dtype only),
    for the rows of this rank's stages; run under FakeTensorMode (no compute, no memory)."""
    if example_inputs is None:
        return {}
    from torch._subclasses.fake_tensor import FakeTensorMode
    need = {i for v in virtual for i in range(*stages[v])}
    last = max(need)
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    out = {}
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level, log.level = log.level, logging.CRITICAL  # a failed shape probe is not an error here
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
            x = tuple(mode.from_tensor(t) for t in inputs)
            for i in range(last + 1):
                first = x[0] if isinstance(x, tuple) else x
                if i in need:
                    out[i] = torch.empty(first.shape, dtype=first.dtype, device="meta")
                x = rows.modules[i](*x) if isinstance(x, tuple) else rows.modules[i](x)
    except Exception:  # shapes are a hint to the rewrite; it infers them for gpt/llama rows
        return out
    finally:
        log.setLevel(level)
    return out


def _is_fsdp(module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(module, FSDPModule)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t

