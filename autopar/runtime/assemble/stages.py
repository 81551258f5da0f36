"""This rank's pipeline stages, cut from the serial model: which rows each virtual stage runs,
each row rewritten for tp / sp / recompute, and every local tensor mapped back to the serial
model's state-dict keys.

Kept apart from ``autopar.runtime.apply`` because it is the one place that knows how a local
stage tensor relates to the serial model — the mapping that tied parameters, checkpoints
(``autopar.runtime.checkpoints.gather``) and the optimizer's parameter names all rely on.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from autopar.runtime.assemble.rows import Rows, StageModule, row_weights
from autopar.runtime.assemble.state_hooks import raw_state_dict
from autopar.runtime.faults import dist as adist
from autopar.trace.batch_norm import frozen_batch_statistics
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan, rank_of_stage
from costmodels.contracts.split import check_stage_rows, partition


def stage_ranges(plan: Plan, rows: Rows, spec, table, seq=None) -> tuple[tuple[int, int], ...]:
    """The half-open row range of each virtual stage: the plan's ``stages``, else the cost
    model's balanced split of the layer table (``table``, or traced from ``spec``), else the
    same partition over a FLOP proxy of the rows."""
    n, v = len(rows), plan.virtual_stages
    check_stage_rows(plan, n)
    if plan.stages is not None:
        return plan.stages
    if table is None and spec is not None:
        try:
            from autopar.trace import table_for
            table = table_for(spec, micro_batch=plan.micro_batch_size, seq=seq)
        except ImportError:
            table = None
    if table is not None and len(table.rows) == n:
        from costmodels.contracts.split import balanced_stages
        return balanced_stages(table, v)
    return partition(row_weights(rows), v)


def tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every parameter and persistent buffer, aliases included."""
    out = list(module.named_parameters(remove_duplicate=False))
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for n, b in mod.named_buffers(recurse=False):
            if n not in skip:
                out.append((f"{mod_name}.{n}" if mod_name else n, b))
    return out


def row_state_keys(model: nn.Module, rows: Rows) -> tuple[list[str], list[dict[str, list[str]]]]:
    """The serial model's state-dict keys, and per row: its local tensor names -> the keys of
    that tensor (all aliases of a tied tensor; the first is canonical)."""
    sd = raw_state_dict(model)   # parameter names, before any state-dict hook renames them
    key_of: dict[int, list[str]] = {}
    for k, t in sd.items():
        key_of.setdefault(id(t), []).append(k)
    row_keys = [{n: key_of[id(t)] for n, t in tensors(m) if id(t) in key_of} for m in rows.modules]
    return list(sd), row_keys


def pipeline_users(row_keys: list[dict[str, list[str]]], stages_rows, plan: Plan) -> dict[str, set[int]]:
    """Per canonical state-dict key: the pipeline ranks whose stages use that tensor."""
    users: dict[str, set[int]] = {}
    for v, (a, b) in enumerate(stages_rows):
        for i in range(a, b):
            for keys in row_keys[i].values():
                users.setdefault(keys[0], set()).add(rank_of_stage(plan, v))
    return users


def rewrites(plan: Plan) -> bool:
    """Whether the plan's rows go through the rewrite (tp, sequence parallel, recompute or cp)."""
    return plan.tp > 1 or plan.sequence_parallel or plan.recompute != "none" or plan.cp > 1


def rewrite(module: nn.Module, kind: str, example, plan: Plan, tp_rank: int,
            layout: adist.Layout, name: str | None = None) -> nn.Module:
    """The row for this tp rank under the plan's tp / sp / recompute (the row itself when none)."""
    if not rewrites(plan):
        return module
    try:
        from autopar.rewrite import rewrite_row
    except ImportError:
        raise PlanError("this plan needs tensor parallel / sequence parallel / recompute "
                        "(autopar.rewrite), which this autopar does not have yet; use tp=1, "
                        "sequence_parallel=false, recompute='none'") from None
    cp = None
    if plan.cp > 1:
        cp = dict(cp=plan.cp, rank=layout.cp_rank, group=layout.group("cp"),
                  name=name or type(module).__name__)
    return rewrite_row(module, kind=kind, tp_rank=tp_rank, tp_size=plan.tp,
                       tp_group=layout.group("tp") if plan.tp > 1 else None,
                       sequence_parallel=plan.sequence_parallel, recompute=plan.recompute,
                       example_input=example, context_parallel=cp)


@dataclass
class LocalStages:
    """This rank's stage modules, one per local virtual stage, with their tensors' origins."""

    modules: list[StageModule] = field(default_factory=list)
    names: list[dict[str, list[str]]] = field(default_factory=list)  # local name -> state-dict keys
    shards: list[dict[str, object]] = field(default_factory=list)    # local name -> rewrite ShardSpec
    stats: dict[str, int] = field(default_factory=dict)   # peak_param_bytes, param_bytes (meta build)

    def note_peak(self, modules, filler=None, inflight: bool = False) -> None:
        """Record the parameter bytes live now: ``modules``, the tensors ``filler`` keeps for
        later rows and (``inflight``, just after a fill) the other rank's row it initialised."""
        live = live_param_bytes(modules, filler.held() if filler else ())
        live += filler.inflight_bytes if filler and inflight else 0
        self.stats["peak_param_bytes"] = max(self.stats.get("peak_param_bytes", 0), live)


def build_local_stages(rows: Rows, row_keys, stages_rows, virtual, example_inputs, plan: Plan,
                       tp_rank: int, layout: adist.Layout, filler=None, device=None) -> LocalStages:
    """Each local virtual stage as a StageModule of its rows, rewritten for tp / sp / recompute.

    With ``filler`` (a meta-built model, or weights to load: ``autopar.runtime.assemble.materialize``)
    each row is materialised just before it is cut, its full copy put back on meta once this
    rank's shard is cut from it, and under ZeRO-2/3 each block sharded by FSDP2 at once, so the
    rank never holds more than its share plus one row (``LocalStages.stats`` says how much).
    Weights into a row the rewrite cuts skip the full row altogether: the meta row is cut and
    only this rank's rectangles of each tensor are read (``RowFiller.fill_shard``)."""
    examples = row_inputs(rows, example_inputs, stages_rows, virtual)
    out = LocalStages()
    fsdp = filler is not None and plan.zero >= 2 and plan.dp * plan.cp > 1
    for v in virtual:
        a, b = stages_rows[v]
        mods, names, shards = [], {}, {}
        for j, i in enumerate(range(a, b)):
            row = rows.modules[i]
            if filler is not None and filler.weights is not None and rewrites(plan) and \
                    any(t.is_meta for _, t in tensors(row)):
                # weights into a cut row: cut it on meta, then read only this rank's slices
                r = rewrite(row, rows.kinds[i], examples.get(i), plan, tp_rank, layout, rows.names[i])
                filler.fill_shard(i, r, getattr(r, "autopar_shards", None) or {}, tp_rank, plan.tp)
                out.note_peak([*out.modules, *mods, r], filler)
            else:
                if filler is not None:
                    filler.fill(i)
                    out.note_peak([*out.modules, *mods, row], filler, inflight=True)
                r = rewrite(row, rows.kinds[i], examples.get(i), plan, tp_rank, layout, rows.names[i])
                if filler is not None:
                    out.note_peak([*out.modules, *mods, row, r], filler)
                    if r is not row:
                        row.to("meta")   # the full row: only this rank's shard is kept
            if fsdp and rows.kinds[i] == "block":
                from torch.distributed.fsdp import fully_shard

                from autopar.runtime.step.data_parallel import fsdp_mesh
                fully_shard(r, mesh=fsdp_mesh(layout, plan, (device or torch.device("cpu")).type),
                            reshard_after_forward=plan.zero == 3)
            spec_of = getattr(r, "autopar_shards", None) or {}
            for n, _ in tensors(r):
                sh = spec_of.get(n)
                keys = row_keys[i].get(sh.name if sh is not None else n)
                if keys:
                    names[f"rows.{j}.{n}"] = keys
                    if sh is not None and getattr(sh, "dim", None) is not None:
                        shards[f"rows.{j}.{n}"] = sh
            mods.append(r)
        out.modules.append(StageModule(mods, rows.kinds[a:b]))
        out.names.append(names)
        out.shards.append(shards)
    if filler is not None:
        out.note_peak(out.modules)
        out.stats["param_bytes"] = live_param_bytes(out.modules)
    return out


def live_param_bytes(modules, extra=(), exclude=()) -> int:
    """Bytes of the real (not meta) parameters of ``modules`` and the tensors ``extra``, each
    storage once (a DTensor's local shard), leaving out the storages of ``exclude``."""
    seen = {t.untyped_storage().data_ptr() for t in exclude}
    total = 0
    for p in [q for m in modules for q in m.parameters()] + list(extra):
        t = p._local_tensor if hasattr(p, "_local_tensor") else p
        if t.is_meta or t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        total += t.untyped_storage().nbytes()
    return total


def tie_parameters(local: LocalStages, users: dict[str, set[int]],
                   layout: adist.Layout) -> list[tuple[int, str, object]]:
    """Make each tied tensor one Parameter on this rank (the rewrite clones what it returns) and
    return (stage, name, group) for those also used on other pipeline ranks, whose gradients are
    all-reduced over ``group`` after backward (Megatron's embedding group)."""
    first: dict[str, nn.Parameter] = {}
    cross_rank = []
    for s, stage in enumerate(local.modules):
        for n, p in list(stage.named_parameters(remove_duplicate=False)):
            keys = local.names[s].get(n)
            if not keys:
                continue
            if keys[0] in first:
                if first[keys[0]] is not p:
                    owner, _, leaf = n.rpartition(".")
                    setattr(stage.get_submodule(owner) if owner else stage, leaf, first[keys[0]])
                continue
            first[keys[0]] = p
            ranks = users.get(keys[0], set())
            if len(ranks) > 1:
                peers = [layout.rank_at(pp=r) for r in sorted(ranks)]
                cross_rank.append((s, n, adist.group(peers)))
    return cross_rank


def row_inputs(rows: Rows, example_inputs, stages, virtual) -> dict:
    """Each row's serial input for one micro-batch, as ``meta`` tensors (shape and dtype only),
    for the rows of this rank's stages; run under FakeTensorMode (no compute, no memory)."""
    if example_inputs is None:
        return {}
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autopar.rewrite.experts import experts_shape_only
    need = {i for v in virtual for i in range(*stages[v])}
    last = max(need)
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    out = {}
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level, log.level = log.level, logging.CRITICAL  # a failed shape probe is not an error here
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad(), \
                frozen_batch_statistics(nn.ModuleList(rows.modules[:last + 1])), \
                experts_shape_only(nn.ModuleList(rows.modules[:last + 1])):   # MoE routing: data-dependent
            on_meta = any(p.is_meta for p in rows.modules[0].parameters())   # a meta build: meta inputs
            x = tuple(mode.from_tensor(t.to("meta") if on_meta else t) for t in inputs)
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
