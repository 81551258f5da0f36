"""A disk cache of traced LayerTables for the built-in models, so that a command does not re-trace.

Tracing a built-in preset is deterministic in its resolved ``ModelConfig``, the micro-batch, the
``--leaf`` classes and the code that builds and traces it, but the DeepSeek-V3-like preset takes
10–35 s of every ``autopar search`` (issue 27). The table is stored as its JSON
(``LayerTable.to_dict``; read back through ``LayerTable.from_dict``, which checks every field)
under ``$XDG_CACHE_HOME/autopar/tables`` (``~/.cache/autopar/tables`` without it). The key is a
SHA-256 of everything the table depends on:

- the resolved model configuration (``repr`` of the ``ModelConfig``: every field, ``seq``
  included), the micro-batch and the leaf classes;
- the source of every module under ``autopar/`` and ``costmodels/`` (any edit of the models, the
  trace, the rewrite or the table contract makes old entries stale: they are never read again);
- the torch version (the trace runs torch.fx and meta kernels).

Only the built-in presets and families are cached: a user's ``file.py:fn`` or ``hf:`` model can
change under the same spec without a code change here. Writes are atomic (a temporary file in
the same directory, then ``os.replace``); an entry that does not parse or does not pass
``from_dict``'s checks is ignored and rewritten; any OS error reading or writing falls back to
tracing. ``AUTOPAR_NO_CACHE=1`` (the CLI's ``--no-cache``) turns it off; the tests point
``XDG_CACHE_HOME`` at a temporary directory (tests/conftest.py) so they never write into a home.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

FORMAT = 1   # bump when the entry's layout (not the table's) changes


def enabled() -> bool:
    return os.environ.get("AUTOPAR_NO_CACHE", "").strip() not in ("1", "true", "yes")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autopar" / "tables"


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """SHA-256 of the source of every module of ``autopar`` and ``costmodels`` (paths and bytes)."""
    h = hashlib.sha256()
    for name in ("autopar", "costmodels"):   # found, not imported (the trace sits below autopar's top)
        root = Path(importlib.util.find_spec(name).origin).resolve().parent
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root.parent)).encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def entry_key(config, micro_batch: int, leaf_modules: tuple) -> str:
    """The entry's file stem: a hash of everything the table depends on (module docstring)."""
    import torch
    parts = [str(FORMAT), repr(config), str(int(micro_batch)), repr(tuple(leaf_modules)),
             code_hash(), torch.__version__]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def load(key: str):
    """The cached LayerTable of ``key``, or None (absent, unreadable, corrupt or failing checks)."""
    from costmodels.contracts.layer_table import LayerTable
    path = cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            return None
        return LayerTable.from_dict(data["table"])
    except Exception:  # noqa: BLE001 — any bad entry is a miss: the caller traces and rewrites it
        return None


def store(key: str, table) -> None:
    """Write ``table`` under ``key`` atomically; an OS error leaves the cache as it was."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "table": table.to_dict()}, f)
            os.replace(tmp, directory / f"{key}.json")
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return


def cached_trace(spec: str, micro_batch: int, seq: int | None, leaf_modules: tuple, trace):
    """``trace()`` (which returns the LayerTable of ``spec``) through the disk cache, for the
    built-in presets and families; other specs, or the cache turned off, trace directly."""
    if not enabled():
        return trace()
    from autopar.models import load_model
    from autopar.models.config import FAMILIES
    from autopar.models.presets import PRESETS
    if spec.strip().partition(":")[0] not in set(PRESETS) | set(FAMILIES):
        return trace()
    source = load_model(spec, seq=seq)
    if source.config is None:
        return trace()
    key = entry_key(source.config, micro_batch, leaf_modules)
    table = load(key)
    if table is None:
        table = trace()
        store(key, table)
    return table
