"""An autopar checkpoint on disk: which directory holds the complete checkpoint (``LATEST``),
and single entries read without a process group (one tensor, the ``autopar`` record).

Kept apart from ``autopar.runtime.checkpoints.dcp`` (saving and loading a Runner) because the readers here
serve also ``autopar.runtime.assemble.weights`` and ``autopar.runtime.checkpoints.export``, which run in one process
and never build a Runner. The layout is described in ``autopar.runtime.checkpoints.dcp``.
"""
from __future__ import annotations

import os

import torch

from autopar.runtime.checkpoints.damage import check_files, damaged, reading
from costmodels.contracts.errors import PlanError

MODEL_PREFIX = "model."
OPTIM_PREFIX = "optim."
LATEST = "LATEST"


def checkpoint_dir(path, missing_ok: bool = False) -> str | None:
    """The DCP directory of the checkpoint at ``path`` (``LATEST``'s, or ``path`` itself)."""
    path = os.fspath(path)
    latest = os.path.join(path, LATEST)
    if os.path.isfile(latest):
        with open(latest, "rb") as f:
            raw = f.read(4096)
        try:
            name = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            steps = sorted(n for n in os.listdir(path) if n.startswith("step-")
                           and os.path.isfile(os.path.join(path, n, ".metadata")))
            fix = (f"write the name of the complete checkpoint in it (e.g. '{steps[-1]}')" if steps
                   else "load an earlier checkpoint")
            raise damaged(latest, "it holds bytes that are not a checkpoint's name", fix) from None
        full = os.path.join(path, name) if name and "\0" not in name else path
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
    """DCP's metadata of ``ckpt``, its shard files checked present and whole (``damage``)."""
    from torch.distributed.checkpoint import FileSystemReader
    path = os.path.join(ckpt, ".metadata")
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise damaged(path, "empty")
    try:
        md = FileSystemReader(ckpt).read_metadata()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001  (unpickling a damaged file raises anything; torch's
        # CheckpointException derives from BaseException)
        raise damaged(path, f"unreadable: {type(e).__name__}") from None
    if not hasattr(md, "state_dict_metadata"):
        raise damaged(path, f"it holds a {type(md).__name__}, not DCP metadata")
    check_files(ckpt, md)
    return md


def tensor_metadata(ckpt: str) -> dict:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    return {k: v for k, v in metadata(ckpt).state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)}


def read_tensor(ckpt: str, key: str, md) -> torch.Tensor:
    """One whole tensor of the checkpoint, read in this process alone."""
    import torch.distributed.checkpoint as dcp
    t = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    with reading(ckpt):
        _quiet(dcp.load, {key: t}, checkpoint_id=ckpt, no_dist=True)
    return t


def read_rect(ckpt: str, key: str, md, offsets, sizes) -> torch.Tensor:
    """One rectangle of a tensor, reading only the saved chunks that overlap it."""
    import torch.distributed.checkpoint as dcp

    from autopar.runtime.assemble.pieces import Piece, Pieces, planners
    t = torch.empty(tuple(sizes), dtype=md.properties.dtype)
    _, loader = planners()
    with reading(ckpt):
        _quiet(dcp.load, {key: Pieces(md.size, [Piece(tuple(offsets), t)])}, checkpoint_id=ckpt,
               no_dist=True, planner=loader)
    return t


def read_object(ckpt: str, key: str = "autopar"):
    """One saved object (``autopar``: the plan, spec, step, shapes and extra)."""
    import torch.distributed.checkpoint as dcp
    md = metadata(ckpt)
    if key not in md.state_dict_metadata:
        raise PlanError(f"'{ckpt}' is a DCP checkpoint autopar did not write (no '{key}' entry)")
    sd = {key: None}
    with reading(ckpt, md):
        _quiet(dcp.load, sd, checkpoint_id=ckpt, no_dist=True)
    if key == "autopar" and not isinstance(sd[key], dict):
        raise damaged(ckpt, f"its 'autopar' entry is a {type(sd[key]).__name__}, not a dict")
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


