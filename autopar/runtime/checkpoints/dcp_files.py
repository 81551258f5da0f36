"""An autopar checkpoint on disk: which directory holds the complete checkpoint (``LATEST``),
and single entries read without a process group (one tensor, the ``autopar`` record).

Kept apart from ``autopar.runtime.checkpoints.dcp`` (saving and loading a Runner) because the readers here
serve also ``autopar.runtime.assemble.weights`` and ``autopar.runtime.checkpoints.export``, which run in one process
and never build a Runner. The layout is described in ``autopar.runtime.checkpoints.dcp``.
"""
from __future__ import annotations

import os

import torch

from costmodels.contracts.errors import PlanError

MODEL_PREFIX = "model."
OPTIM_PREFIX = "optim."
LATEST = "LATEST"


def checkpoint_dir(path, missing_ok: bool = False) -> str | None:
    """The DCP directory of the checkpoint at ``path`` (``LATEST``'s, or ``path`` itself)."""
    path = os.fspath(path)
    latest = os.path.join(path, LATEST)
    if os.path.isfile(latest):
        with open(latest, encoding="utf-8") as f:
            name = f.read().strip()
        full = os.path.join(path, name)
        if name and os.path.isfile(os.path.join(full, ".metadata")):
            return full
        raise PlanError(f"checkpoint '{path}': LATEST names '{name}', which is not a complete "
                        "checkpoint; the directory was changed by hand")
    if os.path.isfile(os.path.join(path, ".metadata")):
        return path
    if missing_ok:
        return None
    raise PlanError(f"'{path}' is not an autopar checkpoint (no LATEST, no DCP .metadata); give "
                    "the directory runner.save wrote")


def metadata(ckpt: str):
    from torch.distributed.checkpoint import FileSystemReader
    try:
        return FileSystemReader(ckpt).read_metadata()
    except Exception as e:  # noqa: BLE001  (unpickling a damaged file raises anything)
        raise PlanError(f"checkpoint '{ckpt}' has an unreadable .metadata ({type(e).__name__}); "
                        "it is damaged: load an earlier one") from None


def tensor_metadata(ckpt: str) -> dict:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    return {k: v for k, v in metadata(ckpt).state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)}


def read_tensor(ckpt: str, key: str, md) -> torch.Tensor:
    """One whole tensor of the checkpoint, read in this process alone."""
    import torch.distributed.checkpoint as dcp
    t = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    _quiet(dcp.load, {key: t}, checkpoint_id=ckpt, no_dist=True)
    return t


def read_rect(ckpt: str, key: str, md, offsets, sizes) -> torch.Tensor:
    """One rectangle of a tensor, reading only the saved chunks that overlap it."""
    import torch.distributed.checkpoint as dcp

    from autopar.runtime.assemble.pieces import Piece, Pieces, planners
    t = torch.empty(tuple(sizes), dtype=md.properties.dtype)
    _, loader = planners()
    _quiet(dcp.load, {key: Pieces(md.size, [Piece(tuple(offsets), t)])}, checkpoint_id=ckpt,
           no_dist=True, planner=loader)
    return t


def read_object(ckpt: str, key: str = "autopar"):
    """One saved object (``autopar``: the plan, spec, step, shapes and extra)."""
    import torch.distributed.checkpoint as dcp
    sd = {key: None}
    _quiet(dcp.load, sd, checkpoint_id=ckpt, no_dist=True)
    return sd[key]


def _quiet(fn, *args, **kwargs):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "assuming the intent is ... one process"
        return fn(*args, **kwargs)


def write_latest(path: str, name: str) -> None:
    tmp = os.path.join(path, f".{LATEST}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, LATEST))


