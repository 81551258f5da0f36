"""A damaged checkpoint as one line naming the file and what to do.

``torch.distributed.checkpoint`` reports a file it cannot read as a ``CheckpointException``
(which derives from ``BaseException``, so ``except Exception`` misses it), an ``AssertionError``
("metadata is None"), an ``EOFError`` or an ``UnpicklingError`` — with one traceback per rank.
Here each becomes a ``PlanError`` that names the file:

* ``check_files(ckpt, md)``: every shard file the ``.metadata`` points into exists and is long
  enough (a truncated ``__0_0.distcp`` is found by its size, before any read, on every rank
  alike: no rank starts a collective read that another refuses);
* ``reading(ckpt)``: any failure of a read becomes "checkpoint file X is damaged", X being a file
  ``check_files`` finds short or missing, else the checkpoint's data files (a bit flip inside a
  file is found only by the read that fails on it).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from costmodels.contracts.errors import AutoparError, PlanError

ADVICE = "load an earlier checkpoint (or save it again from a run that has the state)"
_NOT_DAMAGE = (KeyboardInterrupt, SystemExit, GeneratorExit, AutoparError, MemoryError)


def damaged(path: str, why: str, advice: str = ADVICE) -> PlanError:
    return PlanError(f"checkpoint file '{path}' is damaged ({why}); {advice}")


def check_files(ckpt: str, md) -> None:
    """Refuse a shard file that is missing or shorter than the bytes ``.metadata`` places in it."""
    need: dict[str, int] = {}
    for info in (getattr(md, "storage_data", None) or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is None:
            continue
        end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
        need[rel] = max(need.get(rel, 0), end)
    for rel, end in sorted(need.items()):
        path = os.path.join(ckpt, rel)
        try:
            size = os.path.getsize(path)
        except OSError:
            raise damaged(path, "missing: .metadata places data in it") from None
        if size < end:
            raise damaged(path, f"truncated: {size:,} bytes, .metadata places data up to byte {end:,}")


def _first_line(e: BaseException) -> str:
    failures = getattr(e, "failures", None)     # CheckpointException: {rank: (exception, trace)}
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        cause = first[0] if isinstance(first, tuple) and first else first
        if isinstance(cause, BaseException):
            e = cause
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:120]}" if text else type(e).__name__


@contextmanager
def reading(ckpt: str, md=None):
    """Turn any failure of reading ``ckpt`` into one line naming the damaged file."""
    try:
        yield
    except _NOT_DAMAGE:
        raise
    except BaseException as e:  # noqa: BLE001 — torch's CheckpointException is a BaseException
        if md is not None:
            check_files(ckpt, md)    # names a short or missing file when that is the cause
        files = sorted(n for n in _listdir(ckpt) if n.endswith(".distcp"))
        where = os.path.join(ckpt, files[0]) if len(files) == 1 else \
            os.path.join(ckpt, "*.distcp") if files else ckpt
        raise damaged(where, f"reading it failed: {_first_line(e)}") from None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
