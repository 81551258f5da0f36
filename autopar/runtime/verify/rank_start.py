"""How ``serial.spawn`` starts its ranks: a fresh interpreter each (``spawn``, the default), or
forked from one server that has imported torch and autopar once (``forkserver``).

A fresh interpreter per rank pays torch's import (about 2 s of CPU) once per rank and per
world; a world of 8 ranks on a 2-core host spends about 8 s of wall time on it before any
work. ``AUTOPAR_RANK_START=forkserver`` (set by the test suite, ``tests/conftest.py``) starts
the ranks from Python's fork server with ``PRELOAD`` imported: the server imports them once
for the whole calling process, each rank is a fork of it. The fork server is started once
per calling process and kept; its environment is the one it started with, so ``spawn``
hands each rank the caller's current environment (``rank_environment``) and the rank sets
it before anything else runs — a rank sees the same variables either way.

Ranks get the same arguments, pickled the same way, and the same ``sys.path`` and working
directory (multiprocessing's preparation data) under both methods; what differs is only that
the preloaded modules are already imported, fresh (nothing has run in the server). The fork
server is started single-threaded: importing these modules starts no thread.
"""
from __future__ import annotations

import multiprocessing
import os

START_ENV = "AUTOPAR_RANK_START"
METHODS = ("spawn", "forkserver")
# what every rank imports anyway: torch, its process groups and pipelining, and autopar's
# runner with the verify/sweep loops that the launcher's callers run, and what the runner's
# first apply imports (the trace and fx rewrite: torch.export, aot_autograd's partitioners)
PRELOAD = ["torch", "torch.distributed", "torch.distributed.pipelining",
           "torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.export._trace",
           "torch._functorch.aot_autograd", "torch._functorch.partitioners", "networkx",
           "autopar.runtime.apply", "autopar.runtime.verify.serial", "autopar.runtime.verify.sweep",
           "autopar.runtime.faults.rank_exit", "autopar.models", "autopar.models.gpt",
           "autopar.models.llama", "autopar.models.moe", "autopar.trace", "autopar.trace.cut"]


def start_method() -> str:
    """``spawn`` unless ``AUTOPAR_RANK_START`` names ``forkserver`` (any other value: spawn)."""
    method = os.environ.get(START_ENV, "spawn").strip().lower()
    if method != "forkserver":
        return "spawn"
    # effective before the server's first start; the server then stays for this process
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD + _also)
    return method


_also: list[str] = []


def preload_also(modules: list[str]) -> None:
    """More modules for this process's fork server to import (before it starts), beside
    ``PRELOAD``: a caller that knows its ranks import them (the suite: transformers' models).
    Not an environment variable, so processes the caller starts do not inherit it."""
    _also.extend(m for m in modules if m not in _also)


_CALLER = "AUTOPAR_RANK_START_CALLER"


def rank_environment(method: str) -> dict | None:
    """The environment a rank must set first: the caller's, under the fork server (whose own
    is that of its start); None under spawn, where a rank inherits it."""
    return {**os.environ, _CALLER: str(os.getpid())} if method == "forkserver" else None


def apply_environment(env: dict | None) -> None:
    """In the rank: make ``os.environ`` exactly the caller's (no-op for None), and write to the
    caller's stdout and stderr of now, as a spawned rank does (the server's are those of its
    start: a terminal, or the capture of the test that started it), where they can be reopened."""
    if env is None:
        return
    caller = env.pop(_CALLER, None)
    os.environ.clear()
    os.environ.update(env)
    for fd in (1, 2) if caller else ():
        try:
            new = os.open(f"/proc/{caller}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:   # a socket, or no /proc: the server's
            continue
        os.dup2(new, fd)
        os.close(new)
