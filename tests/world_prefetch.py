"""The suite's shared gloo worlds, run ahead in one helper process while the single-process tests run.

Most of the suite runs in one process on one core; the worlds of ``test_runtime_parallel``,
``test_runtime_zoo``, ``test_runtime_experts``, ``test_runtime_context_parallel`` (``sweep.run``:
4 or 8 ranks, about a third of the suite's time), ``test_runtime_scale`` (4 ranks),
``test_runtime_compile`` (2 ranks compiling with inductor), ``test_rewrite_tp`` (2 ranks), the
subprocess launches of ``test_train_resume``, ``test_faults_ranks`` and ``test_runtime_cli``
(torchrun: fresh interpreters, nothing timed) and ``test_costmodels_fp8_runs_fit``'s sweep (36
model shapes traced) wait for their module's turn. (A module the suite reaches in its first
seconds gains nothing: its job would start no sooner there.) A module declares its world as
``PREFETCH_WORLD = world_prefetch.Job(fn, args, kwargs)`` and its fixture returns
``world_prefetch.result(__name__, PREFETCH_WORLD)``. Once collection is done (``tests/conftest.py``), a
helper process runs the selected modules' jobs one after another, in the order their tests come,
and leaves each result in a file; the fixture waits for its file, or, when no helper runs its
job (the module run alone, ``AUTOPAR_PREFETCH_WORLDS=0``, the helper gone), calls the job itself.
The world, its cases and its assertions are the same either way; only when it runs changes.

The helper is niced (``NICE``): the tests in the foreground keep the CPU they had, the worlds
take what is left idle. Its environment is the suite's at collection time (a rank takes the
environment of whoever starts it), so no test's ``monkeypatch.setenv`` reaches a world, and its
ranks' output goes to ``<folder>/<module>.log`` instead of the terminal.
"""
from __future__ import annotations

import os
import pickle
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field

ENV = "AUTOPAR_PREFETCH_WORLDS"
NICE = 10

_helper = None        # (process, folder, {module name: job})


@dataclass
class Job:
    fn: object
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __call__(self):
        return self.fn(*self.args, **self.kwargs)


def _run_jobs(folder: str) -> None:
    """In the helper: each (module name, job) of ``<folder>/jobs.pkl`` in turn; the result (or
    the error's traceback) pickled to ``<folder>/<name>.pkl`` once complete."""
    import sys
    with open(os.path.join(folder, "helper.log"), "ab") as log:   # not the suite's terminal
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
    with open(os.path.join(folder, "jobs.pkl"), "rb") as f:
        sys_path, preload, jobs = pickle.load(f)
    sys.path[:] = sys_path                 # the suite's: the test modules the jobs name import
    jobs = pickle.loads(jobs)

    from autopar.runtime.verify import rank_start
    os.nice(NICE)
    rank_start.preload_also(preload)
    for name, job in jobs:
        with open(os.path.join(folder, f"{name}.log"), "ab") as log:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
            t0 = time.monotonic()
            print(f"world_prefetch: {name} started at {time.time():.1f}", flush=True)
            try:
                out = ("ok", job())
            except BaseException:  # noqa: BLE001 — handed to the fixture, which raises it
                out = ("error", traceback.format_exc())
            print(f"world_prefetch: {name} took {time.monotonic() - t0:.1f} s", flush=True)
            sys.stdout.flush(), sys.stderr.flush()
        tmp = os.path.join(folder, f"{name}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(out, f)
        os.replace(tmp, os.path.join(folder, f"{name}.pkl"))


def start(jobs: list) -> None:
    """Start the helper on ``[(module name, job), ...]`` (nothing when empty or disabled).

    A plain subprocess in a session of its own, not a ``multiprocessing`` child: the CLI's
    ``stop_children`` (run in-process by the interrupt tests) stops every ``active_children()``
    of this process, and would end the helper with them."""
    global _helper
    if not jobs or os.environ.get(ENV, "1") == "0" or _helper is not None:
        return
    import subprocess
    import sys

    from autopar.runtime.verify import rank_start
    folder = tempfile.mkdtemp(prefix="autopar-worlds-")
    with open(os.path.join(folder, "jobs.pkl"), "wb") as f:
        pickle.dump((list(sys.path), list(rank_start._also), pickle.dumps(jobs)), f)
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); "
                          f"import world_prefetch; world_prefetch._run_jobs({folder!r})"],
                         stdin=subprocess.DEVNULL, start_new_session=True)
    _helper = (p, folder, dict(jobs))


def stop() -> None:
    """End the helper, its fork server and ranks (at the session's end, or after -x), and
    remove its folder."""
    global _helper
    if _helper is None:
        return
    p, folder, _ = _helper
    _helper = None
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except OSError:
            p.terminate()
    try:
        p.wait(30)
    except Exception:  # noqa: BLE001
        p.kill()
    if os.environ.get(ENV) != "keep":   # =keep: leave the helper's logs (their timings) in place
        shutil.rmtree(folder, ignore_errors=True)


def result(name: str, job: Job):
    """The world's result: the helper's when it ran (or runs) this module's job, else the job's
    own, run here and now."""
    if _helper is None or name not in _helper[2]:
        return job()
    p, folder, _ = _helper
    path = os.path.join(folder, f"{name}.pkl")
    while not os.path.exists(path):
        if p.poll() is not None and not os.path.exists(path):
            return job()          # the helper ended without it: run it here
        time.sleep(0.2)
    with open(path, "rb") as f:
        status, value = pickle.load(f)
    print(f"world of {name} run ahead in {folder}")
    if status == "error":
        raise RuntimeError(f"the world of {name} failed in the prefetch helper:\n{value}")
    return value
