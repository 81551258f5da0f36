"""The suite's ranks start from a fork server that has imported torch and autopar once
(``autopar.runtime.verify.rank_start``): every world of ``serial.spawn`` — the shared gloo worlds,
``autopar verify``/``profile``/``validate`` run in-process or as a subprocess of a test — forks its
ranks instead of importing torch once per rank. Users' runs keep ``spawn`` (the default):
tests/test_runtime_cli.py's ``autopar verify`` test runs that way; tests/test_runtime_rank_start.py
checks that a forked rank sees the caller's environment and working directory of the moment.

The suite's own server (this process's, not its subprocesses') also imports transformers' models
that the zoo, experts, context parallel and scale worlds build (about 4 s once, instead of per rank).

``AUTOPAR_RANK_START`` already set (``=spawn``) wins: the whole suite with fresh interpreters.
``AUTOPAR_NO_CACHE=1``: the suite never reads or writes the trace's disk cache.
"""
from __future__ import annotations

import os

os.environ.setdefault("AUTOPAR_RANK_START", "forkserver")
# the trace's disk cache (autopar.trace.disk_cache) is off in the suite, its subprocesses included:
# nothing is written into a home; tests/test_trace_disk_cache.py turns it on in a tmp directory
os.environ["AUTOPAR_NO_CACHE"] = "1"

from autopar.runtime.verify import rank_start  # noqa: E402

rank_start.preload_also(["transformers"] + [f"transformers.models.{m}.modeling_{m}" for m in (
    "gpt2", "llama", "qwen2", "bert", "mixtral", "vit", "phi3", "olmo2", "bloom", "deberta_v2", "gemma",
    "opt", "falcon", "qwen2_moe")])


def pytest_collection_finish(session):
    """Start the shared worlds of the selected modules (``PREFETCH_WORLD``) in a helper process, in the
    order their tests come (tests/world_prefetch.py), while the tests before them run."""
    if session.config.option.collectonly:
        return
    import world_prefetch
    jobs, seen = [], set()
    for item in session.items:
        module = getattr(item, "module", None)
        job = getattr(module, "PREFETCH_WORLD", None)
        if isinstance(job, world_prefetch.Job) and module.__name__ not in seen:
            seen.add(module.__name__)
            jobs.append((module.__name__, job))
    world_prefetch.start(jobs)


def pytest_sessionfinish(session):
    import world_prefetch
    world_prefetch.stop()
