"""Every check of a plan against a model that needs no process group, run before there is one.

``autopar.apply`` runs ``check_before_launch`` before ``init_process_group``, ``autopar verify``
before it spawns a rank, ``autopar apply --emit`` before it writes a file. A plan that cannot run
then fails in one line in the process that launches it, at once, instead of after every rank has
connected and built its process groups — and the same rules run in the search
(``costmodels.contracts.runnable``), so the search never proposes such a plan.

What is checked, in order:

1. the model can be cut into layer-table rows (``autopar.runtime.assemble.rows.model_rows``);
2. ``costmodels.contracts.runnable.check_runnable``: micro-batches vs schedule, tp vs heads / kv heads /
   ffn / sequence, pp·vpp vs rows — with the sizes of a built-in model's config; an FP8 plan
   against this machine (``autopar.runtime.assemble.float8.check_float8``: CUDA, FP8 tensor cores, torchao);
3. the stage split (``stage_ranges``: pinned stages end at the last row), and under ZeRO-2/3
   no parameter shared by two stages of one pipeline rank (``check_fsdp_shared``);
   ``tp_modules.check_tp_modules``: no nn.MultiheadAttention or convolution in a block under tp;
4. when the plan rewrites rows (tp > 1, sequence parallel or recompute): the rewrite itself, on
   a ``meta`` copy of each distinct row against a ``FakeGroup`` (no weights copied, no
   communication), which finds what sizes cannot tell — an op the rewrite cannot shard, a
   user block whose heads tp does not divide, a softmax selective recompute cannot isolate.

Errors raised here carry ``same_on_every_rank = True``: every rank of a launch computes the same
one, so under torchrun only rank 0 prints it (``autopar.runtime.faults.failures``).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn as nn

from autopar.runtime.assemble.batch_statistics import check_batch_statistics
from autopar.runtime.assemble.float8 import check_float8
from autopar.runtime.assemble.rows import Rows, model_rows
from autopar.runtime.assemble.stages import row_inputs, stage_ranges
from autopar.runtime.assemble.tp_modules import check_tp_modules
from costmodels.contracts.errors import AutoparError, PlanError
from costmodels.contracts.plan import rank_of_stage
from costmodels.contracts.runnable import ModelDims, check_runnable
from costmodels.profiles.runtime import load_runtime

_FAMILIES_WITH_HEADS = ("gpt", "llama", "bert", "vit", "moe")


@dataclass
class Launchable:
    """What the checks computed, so the runner does not compute it again."""

    rows: Rows
    stages: tuple[tuple[int, int], ...]


def check_before_launch(model: nn.Module, plan, *, num_micro_batches: int | None = None,
                        spec: str | None = None, seq: int | None = None, table=None,
                        example_inputs=None, probe: bool = True,
                        allow_batch_statistics: bool = False, leaf_modules=(),
                        on_this_machine: bool = True) -> Launchable:
    """Raise the PlanError (one line) the runtime would raise for ``plan`` on ``model``, without
    a process group; ``num_micro_batches`` (per step) is checked against the schedule when
    given. ``model`` may be on any device, ``meta`` included. ``probe=False`` skips step 4
    (``apply`` when a process group already exists: the real rewrite follows at once and
    raises the same line, so probing first would only double the rewrite's time).
    ``allow_batch_statistics``: run a BatchNorm model micro-batched anyway (``batch_statistics``).
    ``leaf_modules``: classes (or names) the row cutter keeps whole, as the trace (``--leaf``).
    ``on_this_machine=False``: the plan launches elsewhere (an export), so what this machine's
    devices can run (FP8 tensor cores, torchao) is not checked."""
    try:
        load_runtime(plan.runtime)   # a runtime no profile describes ("nonexistent", "megatron:nooption")
        check_batch_statistics(model, plan, num_micro_batches, allow_batch_statistics)
        if getattr(plan, "cp", 1) > 1:   # rows run on S / cp tokens (autopar.runtime.step.context)
            from autopar.runtime.step.context import local_example
            example_inputs = local_example(example_inputs, plan, model)
        rows = model_rows(model, example_inputs, leaf_modules)
        check_runnable(plan, model_dims(model, len(rows)), num_micro_batches)
        check_tp_modules(rows, plan)
        if on_this_machine:
            check_float8(plan)   # an FP8 plan on a CPU / a GPU without FP8 / without torchao
        from autopar.runtime.step.experts import (
            check_expert_capacity,
            check_expert_model,
            check_expert_sequence_parallel,
        )
        if plan.ep > 1:   # the runtime shards autopar's own MoE layers (runtime/step/experts.py)
            check_expert_model(model, plan)
        check_expert_sequence_parallel(model, plan)
        check_expert_capacity(model, plan)
        stages = tuple(stage_ranges(plan, rows, spec, table, seq))
        check_fsdp_shared(rows, stages, plan)
        if probe and (plan.tp > 1 or plan.sequence_parallel or plan.recompute != "none"
                      or plan.cp > 1):
            probe_rewrite(model, rows, stages, plan, example_inputs)
    except AutoparError as e:
        e.same_on_every_rank = True
        raise
    return Launchable(rows=rows, stages=stages)


def check_fsdp_shared(rows: Rows, stages, plan) -> None:
    """ZeRO-2/3 shard each stage with its own FSDP2 ``fully_shard``; one Parameter that two stages
    of one pipeline rank share (a tied embedding and LM head, both on rank 0 under a V schedule)
    would belong to two of them, and its gradient comes out wrong. Such a plan is refused."""
    if plan.zero < 2 or plan.dp < 2 or plan.pp < 2:
        return
    first: dict[int, tuple[int, str]] = {}   # id(parameter) -> (virtual stage, row name)
    for v, (a, b) in enumerate(stages):
        for i in range(a, b):
            for name, p in rows.modules[i].named_parameters(remove_duplicate=False):
                seen = first.setdefault(id(p), (v, f"{rows.names[i]}.{name}"))
                if seen[0] != v and rank_of_stage(plan, seen[0]) == rank_of_stage(plan, v):
                    raise PlanError(
                        f"plan field 'zero'={plan.zero} shards each pipeline stage with FSDP2, but "
                        f"virtual stages {seen[0]} and {v} of pipeline rank "
                        f"{rank_of_stage(plan, v)} share one parameter ({seen[1]} = "
                        f"{rows.names[i]}.{name}) under schedule '{plan.schedule}'; use zero=1, "
                        "untie it, or a schedule that places those stages on different ranks")


def model_dims(model: nn.Module, n_rows: int) -> ModelDims:
    """The sizes the rules read: a built-in model's config; only the row count otherwise."""
    return config_dims(getattr(model, "config", None), n_rows)


def config_dims(cfg, n_rows: int) -> ModelDims:
    """``ModelDims`` of a built-in model's ``ModelConfig`` (only ``rows`` for anything else)."""
    from autopar.models.config import ModelConfig
    if not isinstance(cfg, ModelConfig) or cfg.family not in _FAMILIES_WITH_HEADS:
        return ModelDims(rows=n_rows)
    return ModelDims(rows=n_rows, heads=cfg.heads, kv_heads=cfg.n_kv_heads, ffn=cfg.ffn_dim,
                     seq=cfg.tokens_per_sample, tied_ends=bool(getattr(cfg, "tied", False)),
                     experts=cfg.experts if cfg.family == "moe" else 0)


# model -> {(tp, sp, recompute, input shapes): None or the (type, args) of the error}; what a
# probe found holds as long as the model lives (the sweep and the tests check many plans of one)
_PROBED: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def probe_rewrite(model: nn.Module, rows: Rows, stages, plan, example_inputs=None) -> None:
    """Rewrite a ``meta`` copy of each distinct row for tp rank 0 (``FakeGroup``: the rewrite's
    errors do not depend on the rank); raises its PlanError / TraceError."""
    shapes = tuple((tuple(t.shape), str(t.dtype)) for t in _tensors(example_inputs))
    key = (plan.tp, plan.sequence_parallel, plan.recompute, plan.cp, shapes)
    seen = _PROBED.setdefault(model, {})
    if key not in seen:
        try:
            _probe(rows, stages, plan, example_inputs)
            seen[key] = None
        except AutoparError as e:
            seen[key] = (type(e), e.args)
    if seen[key] is not None:
        error_type, args = seen[key]
        raise error_type(*args)


def _tensors(example_inputs) -> tuple:
    if example_inputs is None:
        return ()
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _probe(rows: Rows, stages, plan, example_inputs) -> None:
    from autopar.rewrite import rewrite_row
    from autopar.rewrite.collectives import FakeGroup
    inputs = row_inputs(rows, example_inputs, stages, range(len(stages))) if example_inputs is not None else {}
    seen = set()
    split_of: dict[int, tuple] = {}   # id(tensor) -> (row name, local name, sharded dim)
    for i, (module, kind) in enumerate(zip(rows.modules, rows.kinds)):
        x = inputs.get(i)
        key = (kind, repr(module), None if x is None else (tuple(x.shape), str(x.dtype)))
        if key in seen:
            continue
        seen.add(key)
        gm = rewrite_row(meta_copy(module), kind=kind, tp_rank=0, tp_size=plan.tp,
                         tp_group=FakeGroup(0, plan.tp), sequence_parallel=plan.sequence_parallel,
                         recompute=plan.recompute, example_input=x,
                         context_parallel=dict(cp=plan.cp, rank=0, group=FakeGroup(0, plan.cp),
                                               name=rows.names[i]) if plan.cp > 1 else None)
        _check_ties(module, rows.names[i], getattr(gm, "autopar_shards", {}) or {}, split_of, plan.tp)


def _check_ties(module, row: str, shards: dict, split_of: dict, tp: int) -> None:
    """A tensor shared by two rows (an embedding tied to the LM head) must be split the same way
    in both, or the runtime would tie a shard to a whole tensor and train the wrong model."""
    dims = {spec.name: spec.dim for spec in shards.values()}
    for name, p in module.named_parameters(remove_duplicate=False):
        mine = (row, name.removeprefix("inner."), dims.get(name))
        other = split_of.setdefault(id(p), mine)
        if other[2] != mine[2]:
            raise PlanError(f"plan field 'tp'={tp}: the tensor {other[1]} of row {other[0]} is tied to "
                            f"{mine[1]} of row {row}, but the tensor-parallel rewrite splits them differently "
                            f"(dim {other[2]} vs {mine[2]}); use tp=1 or untie them")


def meta_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are on ``meta`` (no data copied;
    tied tensors stay tied)."""
    memo: dict[int, object] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) in memo:
            continue
        m = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else m
    from autopar.trace.cut import deepcopy_rebound
    return deepcopy_rebound(module, memo)   # a lambda in a block calls the copy's modules
