"""A rank that died or was killed, named in one ``autopar:`` line with what it was doing.

* What a rank is doing: ``peer_failures(operation, ...)`` (every collective section of the
  runtime: apply, train_step, save, load ...) records its operation here (``doing``); where
  ``AUTOPAR_PHASE_DIR`` is set (``autopar verify`` sets it for its ranks) it is also written to
  ``<dir>/rank<R>.phase``, so that the launcher can say it after the rank is gone.
* Under torchrun: when one rank dies, torchrun's agent sends SIGTERM to the others and, after
  their exit, prints its ~60-line summary. ``install_sigterm_report`` gives each rank a SIGTERM
  handler that asks the heartbeats (``liveness``) which rank stopped; the lowest surviving rank
  prints ``autopar: error: rank R died or was killed during <operation> ...`` — before
  torchrun's summary — and every rank exits 143 as SIGTERM would. A SIGTERM with every rank
  alive (the user stopping the job) prints nothing.
* Under ``autopar verify`` (``torch.multiprocessing`` ranks): ``rank_died`` turns the
  ``ProcessExitedException`` of a rank killed by a signal or exiting without a result into
  ``RankDiedError``, one line naming the rank, the signal or exit code and its last operation.
"""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

from costmodels.contracts.errors import AutoparError

PHASE_DIR_ENV = "AUTOPAR_PHASE_DIR"
_current: list[str] = []
_failed_in: list[str] = []


class RankDiedError(AutoparError):
    """A rank of the job ended (a signal, an exit) in the middle of the work."""


@contextmanager
def doing(operation: str):
    """Record ``operation`` as what this rank is doing while the block runs."""
    _current.append(operation)
    _write_phase(operation)
    try:
        yield
    except BaseException:
        _failed_in[:] = [operation]   # a peer's death surfaces as this block's error
        raise
    finally:
        _current.pop()


def current() -> str | None:
    """The operation under way, else the one that just failed."""
    return _current[-1] if _current else (_failed_in[0] if _failed_in else None)


def _write_phase(operation: str) -> None:
    folder = os.environ.get(PHASE_DIR_ENV)
    if not folder:
        return
    path = os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.phase")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(operation)
    except OSError:
        pass


def read_phase(folder: str, rank: int) -> str | None:
    try:
        with open(os.path.join(folder, f"rank{rank}.phase"), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def rank_died(exc: BaseException, phase_dir: str | None, what: str) -> BaseException:
    """``RankDiedError`` for torch.multiprocessing's ``ProcessExitedException`` (``exc`` itself
    for anything else): which rank, how it ended, what it was doing."""
    rank = getattr(exc, "error_index", None)
    if rank is None or type(exc).__name__ != "ProcessExitedException":
        return exc
    how = (f"was killed by {exc.signal_name}" if getattr(exc, "signal_name", None)
           else f"exited with code {exc.exit_code}")
    doing_what = read_phase(phase_dir, rank) if phase_dir else None
    during = f" during {doing_what}" if doing_what else f" during {what}"
    hint = (" (SIGKILL is also what the out-of-memory killer sends: check dmesg)"
            if getattr(exc, "signal_name", None) == "SIGKILL" else "")
    return RankDiedError(f"rank {rank} {how}{during}; the other ranks were stopped{hint}")


def install_sigterm_report() -> None:
    """Under a launcher of more than one process, name a dead peer when the launcher stops this
    rank (module docstring). Installed once, from the main thread only."""
    if getattr(signal.getsignal(signal.SIGTERM), "autopar_report", False):
        return
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if os.environ.get(PHASE_DIR_ENV):   # autopar verify's ranks: the launcher itself names the rank
        return

    import atexit
    atexit.register(_mark_exited)   # a rank that exits (its own error printed) did not die

    def on_sigterm(signum, frame):
        from autopar.runtime.faults import liveness
        me, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        stopped = liveness.stopped_ranks(range(world), me) or []
        if any(_has_exited(r) for r in range(world)):
            stopped = []     # a rank ended through Python (and said why): no rank was killed
        alive = sorted(set(range(world)) - set(stopped))
        if stopped and alive and alive[0] == me:
            who = f"rank {stopped[0]}" if len(stopped) == 1 else "ranks " + ", ".join(map(str, stopped))
            during = f" during {current()}" if current() else ""
            try:
                print(f"autopar: error: {who} died or was killed{during} (its heartbeat stopped); "
                      "the launcher is stopping the other ranks: see its log (SIGKILL is also what "
                      "the out-of-memory killer sends: check dmesg)", file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass
        os._exit(128 + signal.SIGTERM)

    on_sigterm.autopar_report = True
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):   # not the main thread
        pass


def _exited_key(rank) -> str:
    return f"autopar/exited/{rank}"


def _mark_exited() -> None:
    from autopar.runtime.faults import liveness
    beat = liveness._beat
    if beat is not None:
        try:
            beat.store.add(_exited_key(beat.rank), 1)
        except Exception:  # noqa: BLE001 — the store is gone: nobody is left to ask
            pass


def _has_exited(rank: int) -> bool:
    from autopar.runtime.faults import liveness
    beat = liveness._beat
    try:
        return beat is not None and beat.store.add(_exited_key(rank), 0) > 0
    except Exception:  # noqa: BLE001
        return False
