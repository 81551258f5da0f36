"""Distributed checkpoints of a Runner on ``torch.distributed.checkpoint`` (DCP), loadable under
any other plan of the same model (``runner.save`` / ``runner.load``).

What is saved, under the serial model's names so that any plan can read it:

* ``model.<key>``: every parameter and persistent buffer, each rank writing the rectangles of
  the serial tensor it holds (``autopar.runtime.assemble.pieces``: tensor-parallel shards, fused q/k/v
  segments, FSDP2 dim-0 shards; replicas are written once);
* ``optim.<key>.<state>``: the optimizer state of each parameter (Adam's ``exp_avg``, ...) cut
  the same way, scalar states (``step``) whole, and ``optim.param_groups`` (hyper-parameters);
* ``rng.<rank>``: every rank's CPU (and CUDA) generator state, restored when the checkpoint is
  loaded under the same plan on the same world size;
* ``autopar``: the plan (``Plan.to_dict()``), the model spec (and ``seq`` override), the
  step, the global batch, the serial tensor shapes (and which names are aliases of a tied
  tensor) and the user's ``extra`` (e.g. the data position).

Layout on disk, so that a crash mid-save leaves the previous checkpoint whole::

    CKPT/LATEST                  # the name of the complete checkpoint, replaced atomically
    CKPT/step-00000003-1a2b/     # DCP's files (.metadata, __<rank>_0.distcp)
    CKPT/.step-00000006-3c4d.tmp # a save under way (or one a crash interrupted)

A save writes into the temporary directory; when every rank has finished, the plan's first rank
renames it, then replaces ``LATEST`` (temporary file + ``os.replace``) and removes the older
checkpoint. Loading reads the directory ``LATEST`` names (a bare DCP directory is read as is).
"""
from __future__ import annotations

import os
import shutil
import uuid

import torch
import torch.distributed as dist

from autopar.runtime.assemble.pieces import keep_rows, pieces_of, planners, tp_rects
from autopar.runtime.assemble.stages import tensors
from autopar.runtime.checkpoints.damage import reading
from autopar.runtime.checkpoints.dcp_files import (
    LATEST,
    MODEL_PREFIX,
    OPTIM_PREFIX,
    checkpoint_dir,
    metadata,
    read_object,
    write_latest,
)
from autopar.runtime.faults import dist as adist
from autopar.runtime.faults.failures import alike_on_every_rank
from costmodels.contracts.errors import PlanError


# ---- this rank's state as rectangles of the serial tensors ----------------------------------
def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _rects(t: torch.Tensor, full_size, shard, runner):
    """The rectangles of the serial tensor that this rank's ``t`` holds."""
    dim = getattr(shard, "dim", None) if shard is not None else None
    segments = getattr(shard, "segments", None) if shard is not None else None
    rects = tp_rects(tuple(t.shape), full_size, dim, segments, runner.tp_rank, runner.tp_size)
    first = getattr(t, "autopar_expert_first", 0)   # an ep shard: experts [first, first + E/ep)
    if first:
        rects = [((serial[0] + first,) + tuple(serial[1:]), local, sizes) for serial, local, sizes in rects]
    if hasattr(t, "device_mesh"):   # FSDP2: this dp rank keeps a dim-0 chunk
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        sizes, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        if len(sizes):
            rects = keep_rows(rects, offsets[0], offsets[0] + sizes[0])
    return rects


def model_entries(runner):
    """(canonical key, local tensor, rectangles) for each tensor of this rank, once."""
    seen, out = set(), []
    for s, stage in enumerate(runner._local.modules):
        for n, t in tensors(stage):
            keys = runner._local.names[s].get(n)
            if not keys or keys[0] in seen:
                continue
            seen.add(keys[0])
            full = runner._shapes[keys[0]]
            out.append((keys[0], t, _rects(t, full, runner._local.shards[s].get(n), runner)))
    return out


def state_for(runner, optimizer=None, *, for_load: bool = False) -> dict:
    """The DCP state dict of this rank (model, optimizer, meta); views of live storage."""
    sd, by_param = {}, {}
    for key, t, rects in model_entries(runner):
        sd[MODEL_PREFIX + key] = pieces_of(_local(t).detach(), runner._shapes[key], rects)
        by_param[id(t)] = (key, rects)
    if optimizer is not None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in by_param:
                    raise PlanError("runner.save/load: the optimizer holds a parameter that is not "
                                    "this runner's; build it over runner.parameters()")
                key, rects = by_param[id(p)]
                for name, v in optimizer.state.get(p, {}).items():
                    fqn = f"{OPTIM_PREFIX}{key}.{name}"
                    if isinstance(v, torch.Tensor) and v.dim() and v.shape == p.shape:
                        sd[fqn] = pieces_of(_local(v), runner._shapes[key], rects)
                    elif isinstance(v, torch.Tensor):
                        sd[fqn] = v
        sd[OPTIM_PREFIX + "param_groups"] = None if for_load else [
            {k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return sd


def init_optimizer_state(optimizer) -> None:
    """Create the optimizer's state (one step with zero gradients at learning rate 0, as
    ``torch.distributed.checkpoint.state_dict`` does) so that a load has tensors to fill."""
    if optimizer.state:
        return
    saved = []
    for g in optimizer.param_groups:
        saved.append(g.get("lr"))
        if "lr" in g:
            g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, saved):
        if lr is not None:
            g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


# ---- save and load --------------------------------------------------------------------------
def save(runner, path, optimizer=None, extra=None, async_save: bool = False):
    """Write the checkpoint (see the module docstring); returns the DCP directory written, or
    with ``async_save`` a ``PendingSave`` whose ``wait()`` (on every rank) completes it."""
    import torch.distributed.checkpoint as dcp
    path = os.fspath(path)
    lay = runner.layout
    pg = adist.group(lay.ranks)
    if os.path.exists(path) and not os.path.isdir(path):
        raise PlanError(f"checkpoint path '{path}' is a file; give a directory")
    if async_save and len(lay.ranks) != dist.get_world_size():
        raise PlanError("runner.save(async_save=True) needs the plan to span the whole world (its "
                        "writer gets a process group of its own); save synchronously")
    name = [f"step-{runner.step:08d}-{uuid.uuid4().hex[:6]}"]
    if len(lay.ranks) > 1:
        dist.broadcast_object_list(name, src=lay.ranks[0], group=pg)
    tmp = os.path.join(path, f".{name[0]}.tmp")
    if lay.rank == lay.ranks[0]:
        os.makedirs(tmp, exist_ok=True)
    sd = state_for(runner, optimizer)
    sd["autopar"] = dict(version=1, plan=runner.plan.to_dict(), spec=runner.spec, seq=runner.seq,
                         step=runner.step, global_batch=runner.global_batch,
                         world_size=len(lay.ranks), shapes=runner._shapes,
                         aliases=runner._aliases, extra=extra)
    sd[f"rng.{lay.ranks.index(lay.rank)}"] = rng_state()
    saver, _ = planners()
    _barrier(pg, lay)
    writer = dcp.FileSystemWriter(tmp)
    if async_save:   # staged (copied) before it returns; written by a thread on its own group
        global _ASYNC_GROUP
        if _ASYNC_GROUP is None:
            _ASYNC_GROUP = dist.new_group(backend="gloo")
        future = dcp.async_save(sd, storage_writer=writer, planner=saver, process_group=_ASYNC_GROUP)
        return PendingSave(path, name[0], pg, lay, future)
    dcp.save(sd, storage_writer=writer, planner=saver, process_group=pg)
    return PendingSave(path, name[0], pg, lay, None).wait()


_ASYNC_GROUP = None


class PendingSave:
    """A save whose files are being written; ``wait()`` on every rank of the plan finishes it
    (the temporary directory renamed, ``LATEST`` replaced, the older checkpoint removed) and
    returns the DCP directory."""

    def __init__(self, path, name, pg, layout, future):
        self.path, self.name, self.pg, self.layout, self.future = path, name, pg, layout, future

    def wait(self) -> str:
        if self.future is not None:
            self.future.result()
            self.future = None
        lay, path, name = self.layout, self.path, self.name
        _barrier(self.pg, lay)   # every rank's files are written (DCP's .metadata last)
        final = os.path.join(path, name)
        if lay.rank == lay.ranks[0]:
            os.rename(os.path.join(path, f".{name}.tmp"), final)
            write_latest(path, name)
            for old in os.listdir(path):
                full = os.path.join(path, old)
                if old not in (name, LATEST) and os.path.isdir(full) and old.startswith(("step-", ".step-")):
                    shutil.rmtree(full, ignore_errors=True)
                elif old.startswith(f".{LATEST}.") and os.path.isfile(full):   # a save killed
                    _remove(full)   # between its rename and LATEST's replacement left it
        _barrier(self.pg, lay)
        return final


def load(runner, path, optimizer=None):
    """Read the checkpoint into this runner (and ``optimizer``), resharding from whatever plan
    saved it; returns the saved ``extra``."""
    with alike_on_every_rank():   # the files are the same for every rank: rank 0 reports
        return _load(runner, path, optimizer)


def _load(runner, path, optimizer=None):
    import torch.distributed.checkpoint as dcp
    ckpt = checkpoint_dir(path)
    full_md = metadata(ckpt)     # shard files checked present and whole before any collective
    md = full_md.state_dict_metadata
    info = read_object(ckpt) if "autopar" in md else None
    if info is None:
        raise PlanError(f"'{ckpt}' is a DCP checkpoint autopar did not write (no 'autopar' entry)")
    _check_same_model(md, info, ckpt, optimizer, runner._shapes)
    if optimizer is not None:
        init_optimizer_state(optimizer)
    sd = state_for(runner, optimizer, for_load=True)
    _check_entries(sd, md, info, ckpt)
    same_layout = (info["plan"] == runner.plan.to_dict() and info["world_size"] == len(runner.layout.ranks))
    rng_key = f"rng.{runner.layout.ranks.index(runner.rank)}"
    if same_layout and rng_key in md:
        sd[rng_key] = None
    _, loader = planners()
    pg = adist.group(runner.layout.ranks)
    with reading(ckpt, full_md):  # DCP raises a BaseException on every rank for a damaged file
        dcp.load(sd, checkpoint_id=ckpt, planner=loader, process_group=pg)
    if optimizer is not None and sd.get(OPTIM_PREFIX + "param_groups"):
        for g, saved in zip(optimizer.param_groups, sd[OPTIM_PREFIX + "param_groups"]):
            g.update(saved)
    if same_layout and sd.get(rng_key) is not None:
        set_rng_state(sd[rng_key])
    runner.step = int(info.get("step") or 0)
    return info.get("extra")


def _check_same_model(md, info, ckpt, optimizer, shapes) -> None:
    """One line, on every rank alike and before anything changes, when the checkpoint is of
    another model (the serial model's names and shapes) or lacks the optimizer state asked for."""
    saved = {k: tuple(v) for k, v in (info.get("shapes") or {}).items()}
    for key, shape in shapes.items():
        if saved.get(key, shape) != tuple(shape) or key not in saved:
            was = f"shape {list(saved[key])}" if key in saved else "no such tensor"
            raise PlanError(f"checkpoint '{ckpt}' was saved from model '{info.get('spec')}': "
                            f"'{key}' has {was} there, {list(shape)} in this model; load it into "
                            "the model it was saved from")
    if optimizer is not None and not any(k.startswith(OPTIM_PREFIX) for k in md):
        raise PlanError(f"checkpoint '{ckpt}' holds no optimizer state (saved without "
                        "optimizer=...); load it with optimizer=None")


def _check_entries(sd, md, info, ckpt) -> None:
    """This rank's entries (after ``_check_same_model`` only an optimizer of another kind,
    e.g. AdamW state asked of a checkpoint saved with SGD, can be missing)."""
    for fqn, v in sd.items():
        if not fqn.startswith((MODEL_PREFIX, OPTIM_PREFIX)):
            continue
        if fqn not in md:
            what = "optimizer state" if fqn.startswith(OPTIM_PREFIX) else "tensor"
            hint = ("it was saved with another optimizer; build the one it was saved with" if
                    fqn.startswith(OPTIM_PREFIX) else
                    f"it was saved from model '{info.get('spec')}', another model than this runner's")
            raise PlanError(f"checkpoint '{ckpt}' has no {what} '{fqn}': {hint}")
        size = getattr(md[fqn], "size", None)
        if size is not None and hasattr(v, "size") and tuple(size) != tuple(v.size()):
            raise PlanError(f"checkpoint '{ckpt}': '{fqn}' has shape {list(size)}, this model's is "
                            f"{list(v.size())}; it was saved from model '{info.get('spec')}'")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _barrier(pg, lay) -> None:
    if len(lay.ranks) > 1:
        dist.barrier(group=pg)


def rng_state() -> dict:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
