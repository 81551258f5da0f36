"""``autopar.apply(model, plan, loss_fn=...)`` → a Runner that trains ``model`` under ``plan``.

What runs where (see also docs/guide.md, "Runtime / verify"):

* **Process groups.** ``apply`` starts the default group from torchrun's environment when none
  exists (gloo on CPU, NCCL on GPU, collectives time out after ``AUTOPAR_COLLECTIVE_TIMEOUT``
  seconds, default 300). The plan's ranks form a DeviceMesh ordered by ``plan.placement``
  (``autopar.runtime.faults.dist``).
* **Rows and stages.** The model is cut into the layer table's rows (``autopar.runtime.assemble.rows``);
  virtual stage ``v`` runs rows ``plan.stages[v]`` on pipeline rank ``v % pp`` (V schedules:
  rank r runs stages r and 2·pp−1−r, ``costmodels.contracts.plan.stages_of_rank``). Without
  ``stages`` the split is ``costmodels.contracts.split.balanced_stages`` of the layer table (when the
  trace is at hand via ``spec=``/``table=``), else the same partition over a FLOP proxy.
* **Tensor / sequence parallel, recompute**: each row of this rank goes through
  ``autopar.rewrite.rewrite_row`` (identity for tp=1 and recompute "none").
* **Pipeline**: ``torch.distributed.pipelining`` ``PipelineStage`` per local virtual stage, run
  by ``ScheduleGPipe`` / ``Schedule1F1B`` / ``ScheduleInterleaved1F1B`` /
  ``ScheduleInterleavedZeroBubble`` / ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` (the last
  three split backward into input and weight passes: ZeRO 0/1 then reduce gradients after the
  step, ``data_parallel.reduces_after_step``). A parameter used by
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

  With pp > 1 torch's ``PipelineStage`` decides when DDP reduces (``no_sync`` for every
  micro-batch but the last, whose backward overlaps the bucketed all-reduce, every schedule);
  ``data_parallel.wrap_dp`` says why DDP's own forward must not prepare the reducer then.
  ZeRO-2/3 under pp > 1 run through ``step.pipeline_stage.ShardedGradStage``: every
  micro-batch's backward reduce-scatters its gradients into the shards (at pp = 1 only the
  last micro-batch's does), ZeRO-3 reshards after each backward, ZeRO-2 keeps its weights
  gathered until the step's last backward; the last stage keeps no outputs.
* **Context parallel / HSDP**: with ``cp > 1`` each rank runs chunks ``i`` and ``2·cp−1−i`` of
  every sequence (``step.context``), its rows' attention, position ids and rotary tables
  rewritten (``autopar.rewrite.context_parallel``); gradients are averaged and ZeRO shards over
  the dp·cp ranks; ``dp_shard`` (HSDP) gives FSDP2 a (replicate, shard) mesh and ZeRO-1 a
  shard group (``faults.sync_groups``).
* **Failures**: plan-vs-model checks run before any process group (``prelaunch``); a rank that
  dies or freezes becomes one ``PeerLostError`` line naming it (``failures``, ``liveness``).

``train_step(inputs, targets)`` takes this dp rank's share of the global batch, runs all
micro-batches (``micro_batch_size`` samples each) and returns the global mean loss, a float on
every rank, equal to the serial model's mean loss over the global batch when ``loss_fn`` returns a
mean over its micro-batch.

This module is the entry point and the Runner; the parts live beside it: ``stages`` (this rank's
stage modules and their state-dict keys), ``data_parallel`` (DDP / ZeRO / FSDP2), ``step``
(micro-batches and pipeline schedules), ``checkpoint`` (the serial state dict back).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.runtime.assemble import state_hooks
from autopar.runtime.assemble.float8 import convert_stage, precompute_scales
from autopar.runtime.assemble.materialize import RowFiller, has_meta
from autopar.runtime.assemble.prelaunch import Launchable, check_before_launch
from autopar.runtime.assemble.stages import (
    build_local_stages,
    pipeline_users,
    row_state_keys,
    stage_ranges,
    tie_parameters,
)
from autopar.runtime.assemble.weights import open_weights
from autopar.runtime.checkpoints.runner_io import RunnerCheckpoints
from autopar.runtime.faults import dist as adist
from autopar.runtime.faults import liveness
from autopar.runtime.faults.failures import alike_on_every_rank, install_error_hook, peer_failures
from autopar.runtime.faults.sync_groups import shard_peers, sync_group
from autopar.runtime.step.clipping import clip_grad_norm_
from autopar.runtime.step.context import (
    check_position_constants,
    context_slice,
    input_names,
    local_example,
    rows_for_cp_rank,
)
from autopar.runtime.step.data_parallel import Zero1, all_reduce_grads, reduces_after_step, wrap_dp
from autopar.runtime.step.experts import ep_rank_sets, has_experts, reduce_expert_grads, shard_experts
from autopar.runtime.step.schedules import all_reduce_tied, make_schedule, run_local, run_pipeline
from autopar.runtime.step.sync_batch_norm import synced
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import load_plan
from costmodels.contracts.runnable import check_schedule

_stage_ranges = stage_ranges  # the name tests import

__all__ = ["Runner", "apply"]


def apply(model: nn.Module, plan, loss_fn: Callable | None = None, *, spec: str | None = None,
          seq: int | None = None, table=None, example_inputs=None, group=None,
          timeout_s: float | None = None, global_batch: int | None = None,
          seed: int | None = None, init_fn: Callable | None = None, weights=None,
          compile: bool = False, allow_batch_statistics: bool = False, leaf_modules=()) -> Runner:
    """Rewrite ``model`` for ``plan`` and return a Runner (see the module docstring).

    ``model`` must be built identically on every rank (same seed). ``plan`` is a Plan, a dict, a
    JSON string or a path (``costmodels.contracts.plans_file.load_plan``). ``loss_fn(output, targets)``
    defaults to autopar's
    token loss (cross-entropy / MSE). ``spec`` (with ``seq``, its sequence-length override) or
    ``table``: the model spec or layer table used for the balanced split when the plan has no
    ``stages``. ``example_inputs``: the model's inputs
    for one micro-batch (only shapes and dtypes matter; taken from ``spec`` when given), which
    tell the tensor-parallel rewrite each row's input shape. ``group``: run on the ranks of this
    process group instead of the whole world. ``global_batch``: samples per optimizer step over
    all dp ranks; when given, its micro-batch count is checked against the schedule before
    launch too (else at the first ``train_step``).

    Models too large for one process: build ``model`` on ``meta`` (``source.build_meta()`` or
    ``torch.device("meta")``); each rank then materialises only the rows it runs, one at a time
    (``autopar.runtime.assemble.materialize``), initialised by the model's own initialiser (or
    ``init_fn(row)``) from a generator seeded by (``seed``, row name) — the weights
    ``autopar.init_serial(model, seed)`` gives in one process — or read from ``weights``: a
    ``torch.save`` state dict, a ``.safetensors`` file, a Hugging Face checkpoint directory or an
    autopar checkpoint (``autopar.runtime.assemble.weights``), only this rank's rows.

    ``compile``: ``torch.compile`` each row of this rank in place, as torchtitan compiles each
    block (``autopar.runtime.step.compile_rows``); every plan the runtime runs, runs compiled.
    ``leaf_modules``: classes (or names) the row cutter keeps whole, as ``--leaf`` does for the
    trace. ``allow_batch_statistics``: run a BatchNorm model micro-batched (each micro-batch
    normalised alone; refused otherwise, ``autopar.runtime.assemble.batch_statistics``); under
    dp its BatchNorms normalise over the whole dp batch (``autopar.runtime.step.sync_batch_norm``).

    Every check of the plan against the model runs before the process group is started
    (``autopar.runtime.assemble.prelaunch``); under a launcher an uncaught error then prints one line on
    one rank (``autopar.runtime.faults.failures``).
    """
    install_error_hook()
    with alike_on_every_rank():   # nothing in here differs between ranks: rank 0 reports it
        if not isinstance(plan, Plan):
            plan = load_plan(plan if isinstance(plan, dict) else str(plan))   # a plan, an estimate dict, JSON, a file
        if example_inputs is None and spec is not None:
            from autopar.models import load_model
            example_inputs = load_model(spec, seq=seq).example_inputs(plan.micro_batch_size, "cpu")
        m = plan.num_micro_batches(global_batch) if global_batch is not None else None
        ready = check_before_launch(model, plan, num_micro_batches=m, spec=spec, seq=seq,
                                    table=table, example_inputs=example_inputs,
                                    probe=not dist.is_initialized(),
                                    allow_batch_statistics=allow_batch_statistics,
                                    leaf_modules=leaf_modules)
        example_inputs = local_example(example_inputs, plan)   # cp: the S / cp tokens a rank runs
        if group is None or timeout_s is not None:
            adist.ensure_initialized(plan.world_size, timeout_s)
        if not dist.is_initialized():
            raise PlanError("apply(group=...) needs torch.distributed to be initialised first")
    liveness.start(dist.get_rank())
    if loss_fn is None:
        from autopar.models.source import token_loss
        loss_fn = token_loss
    ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
    with peer_failures("apply (building process groups and stages)", list(ranks),
                       dist.get_rank(), adist.timeout_s()), alike_on_every_rank():
        return Runner(model, plan, loss_fn, ready, example_inputs=example_inputs, pg=group,
                      spec=spec, seq=seq, seed=seed, init_fn=init_fn, weights=weights,
                      global_batch=global_batch, compile=compile)


class Runner(RunnerCheckpoints):
    """This rank's part of ``model`` under ``plan``; ``train_step`` runs one step."""

    def __init__(self, model: nn.Module, plan: Plan, loss_fn: Callable, ready: Launchable, *,
                 example_inputs=None, pg=None, spec=None, seq=None, seed=None, init_fn=None,
                 weights=None, global_batch=None, compile=False):
        self.plan = plan
        self.spec, self.seq, self.step, self.global_batch = spec, seq, 0, global_batch
        self.loss_fn = loss_fn
        self.layout = lay = adist.make_layout(plan, pg)
        self.device = adist.device_for_backend()
        self.rank = lay.rank
        self.dp_rank, self.dp_size = lay.dp_rank, plan.dp
        self.cp_rank, self.cp_size = lay.cp_rank, plan.cp
        self._cp_names = (input_names(model), type(model).__name__)   # to name a refused mask (cp_masks)
        self.tp_rank, self.tp_size = lay.tp_rank, plan.tp
        self.pp_rank, self.pp_size = lay.pp_rank, plan.pp

        rows = rows_for_cp_rank(model, ready.rows, example_inputs, plan, lay.cp_rank)
        self._keys, row_keys = row_state_keys(model, rows)
        self._shapes = {k: tuple(t.shape) for k, t in model.state_dict(keep_vars=True).items()}
        self._aliases = {k: ks[0] for names in row_keys for ks in names.values() for k in ks[1:]}
        filler = None
        if weights is not None or has_meta(model):
            source = open_weights(weights, [ks for names in row_keys for ks in names.values()],
                                  self._shapes) if weights is not None else None
            local = {i for v in plan.stages_of_rank(lay.pp_rank) for i in range(*ready.stages[v])}
            filler = RowFiller(rows, row_keys, seed=seed or 0, init_fn=init_fn, model=model,
                               weights=source, local_rows=local)
        self.stages_rows = ready.stages
        n_virtual = plan.virtual_stages
        self.virtual = list(plan.stages_of_rank(lay.pp_rank))   # the V schedules: r, 2·pp−1−r
        self.first_virtual, self.last_virtual = 0, n_virtual - 1

        users = pipeline_users(row_keys, self.stages_rows, plan)
        tied_sets = sorted({tuple(sorted(r)) for r in users.values() if len(r) > 1})
        if pg is None or pg is dist.group.WORLD:  # every rank runs apply: create the groups
            extra = [[lay.rank_at(pp=r, dp=d, tp=t, cp=c) for r in s] for s in tied_sets
                     for d in range(plan.dp) for c in range(plan.cp) for t in range(plan.tp)]
            if plan.ep > 1 or (plan.tp > 1 and has_experts(model)):   # ep / expert-dp groups (step/experts.py)
                extra += [g for sets in ep_rank_sets(plan, lay) for g in sets]
            adist.create_groups(plan, lay.ranks, extra)

        # this rank's stage modules (rows rewritten for tp / sp / recompute), one Parameter per
        # tied tensor; tied across pipeline ranks: grads all-reduced between them after backward
        self._local = build_local_stages(rows, row_keys, self.stages_rows, self.virtual,
                                         example_inputs, plan, self.tp_rank, lay, filler=filler,
                                         device=self.device)
        self.materialized = self._local.stats
        if plan.cp > 1 and rows is not ready.rows:   # a traced model re-cut for this cp rank
            with alike_on_every_rank():
                check_position_constants(self._local.modules, ready.rows, self._example_tokens(example_inputs))
        self._tied = tie_parameters(self._local, users, lay)
        self._state_hooks = state_hooks.capture(model)   # re-applied by full_state_dict
        self._raw = self._local.modules
        self._expert_shards = shard_experts(self._raw, plan, lay) if plan.ep > 1 or plan.tp > 1 else []
        if self.materialized:
            self.materialized["param_bytes"] = self.parameter_bytes()
        for stage in self._raw:
            stage.to(self.device)
            convert_stage(stage, plan)   # FP8 plans: torchao float8 block linears (assemble/float8.py)
        del model, rows  # rows this rank does not run are freed with the model
        from autopar.runtime.step import gpu_defaults
        gpu_defaults.apply_on(self.device)   # TF32 for fp32 matmuls on CUDA (torchtitan's)
        self.compiled = compile
        if compile:   # each row on its own, before DDP / FSDP2 wrap the stage (torchtitan's order)
            from autopar.runtime.step.compile_rows import compile_rows
            compile_rows(self._raw, self.device.type)

        # the plan's DeviceMesh (outer dimension first, per plan.placement; dimensions of size 1
        # left out); FSDP2 gets its 1-D dp slice
        self.mesh = lay.mesh(self.device.type) if plan.world_size > 1 else None
        self._zero1: Zero1 | None = None
        if plan.dp > 1:   # BatchNorm over the whole dp batch, as serial (autopar.runtime.step.sync_batch_norm)
            for s in self._raw:
                synced(s, lay.group("dp"))
        self._wrapped = [wrap_dp(s, plan, lay, self.device) for s in self._raw]
        self._pipe_stages = None
        self._schedules: dict[int, object] = {}
        if plan.pp > 1:
            from autopar.runtime.step.pipeline_stage import ShardedGradStage  # ZeRO-2/3: why, there
            pp_group = lay.group("pp")
            self._pipe_stages = [ShardedGradStage(w, v, n_virtual, self.device, group=pp_group,
                                                  reshard_after_backward=plan.zero == 3)
                                 for w, v in zip(self._wrapped, self.virtual)]

    @staticmethod
    def _example_tokens(example_inputs) -> int:
        first = example_inputs[0] if isinstance(example_inputs, (tuple, list)) else example_inputs
        return int(first.size(1))

    # ---- public API -------------------------------------------------------------------
    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters for the user's optimizer (ZeRO-1: only those it owns; ZeRO-2/3:
        FSDP2's sharded DTensor parameters)."""
        if self.plan.zero == 1 and self.plan.dp * self.plan.cp > 1:
            if self._zero1 is None:
                ids = {id(p) for p in self._expert_shards}   # stepped by their own rank
                self._zero1 = Zero1([p for p in self._all_params() if id(p) not in ids],
                                    shard_peers(self.layout, self.plan), self.layout,
                                    private=self._expert_shards)
            return list(self._zero1.owned)
        return self._all_params()

    def named_parameters(self):
        """(serial model's name, parameter) for this rank's parameters."""
        for s, stage in enumerate(self._raw):
            for n, p in stage.named_parameters():
                yield self._local.names[s].get(n, [n])[0], p

    def _all_params(self) -> list[nn.Parameter]:
        seen, out = set(), []
        for stage in self._raw:
            for p in stage.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def train_step(self, inputs, targets=None, *, sync: bool = True):
        """Forward and backward over this dp rank's batch (``global_batch / dp`` samples) under
        the plan's schedule; returns the global mean loss on every rank. A peer that dies or
        stops answering meanwhile raises ``PeerLostError`` (one line naming it).

        ``sync=True``: the loss as a float — the step's one host-device sync. ``sync=False``:
        a 0-d float64 tensor on the device, reduced over the plan's ranks there; nothing in the
        step waits for the device (``autopar train`` reads it only on the steps it logs)."""
        if self.step:   # FP8 under FSDP2: the weights' scales after the user's optimizer step
            precompute_scales(self._wrapped, self.plan)
        with peer_failures("train_step", self.layout.ranks, self.rank, adist.timeout_s()):
            loss = self._train_step(inputs, targets)
            if sync:
                loss = float(loss.item())
        self.step += 1
        return loss

    def _train_step(self, inputs, targets) -> torch.Tensor:
        plan = self.plan
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        inputs = tuple(t.to(self.device) for t in inputs)
        if targets is not None:
            targets = targets.to(self.device)
        if plan.cp > 1:   # this cp rank's tokens, load-balanced (autopar.runtime.step.context)
            inputs, targets = context_slice(inputs, targets, plan.cp, self.cp_rank, *self._cp_names)
        batch = inputs[0].size(0)
        if batch % plan.micro_batch_size:
            raise PlanError(f"this dp rank's batch of {batch} samples is not divisible by plan "
                            f"field 'micro_batch_size'={plan.micro_batch_size}; pass global_batch/dp "
                            "samples per rank with global_batch divisible by dp·micro_batch_size")
        n_micro = batch // plan.micro_batch_size
        self.global_batch = batch * plan.dp
        with alike_on_every_rank():
            check_schedule(plan, n_micro)
        if plan.pp == 1:
            local = run_local(self._wrapped[0], inputs, targets, n_micro, plan.micro_batch_size,
                              self.loss_fn, keep_unsharded=plan.zero == 2)
        else:
            if n_micro not in self._schedules:
                self._schedules[n_micro] = make_schedule(plan, self._pipe_stages, n_micro,
                                                         self.loss_fn)
            local = run_pipeline(self._schedules[n_micro], inputs, targets,
                                 self.first_virtual in self.virtual, self.last_virtual in self.virtual,
                                 device=self.device)
            if reduces_after_step(plan):   # a split-backward schedule without DDP (why: there)
                all_reduce_grads(self._raw, self.layout, plan.dp * plan.cp)
            all_reduce_tied(self._raw, self._tied)
        if self._expert_shards:
            reduce_expert_grads(self._expert_shards, plan, self.layout)
        t = local.detach().to(device=self.device, dtype=torch.float64).reshape(1)   # on the device
        if plan.pp > 1:
            dist.all_reduce(t, group=self.layout.group("pp"))
        if plan.dp * plan.cp > 1:   # each cp rank's loss is the mean over its tokens
            dist.all_reduce(t, group=sync_group(self.layout))
            t /= plan.dp * plan.cp
        return t[0]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip every gradient by the serial model's global norm (``autopar.runtime.step.clipping``);
        call on every rank after ``train_step``, before the optimizer's ``step``."""
        return clip_grad_norm_(self._raw, self._local.names, self._local.shards, self._tied,
                               self.layout, max_norm, norm_type)

    def parameter_bytes(self) -> int:
        """Bytes of this rank's materialised parameters (local shards; tied ones once)."""
        seen, total = set(), 0
        for p in self._all_params():
            t = p._local_tensor if hasattr(p, "_local_tensor") else p
            if id(p) not in seen and not t.is_meta:
                seen.add(id(p))
                total += t.numel() * t.element_size()
        return total

    def __repr__(self) -> str:
        return (f"Runner(rank={self.rank}, dp={self.dp_rank}/{self.dp_size}, cp={self.cp_rank}/{self.cp_size}, "
                f"tp={self.tp_rank}/{self.tp_size}, pp={self.pp_rank}/{self.pp_size}, "
                f"virtual_stages={self.virtual}, rows={[self.stages_rows[v] for v in self.virtual]})")
