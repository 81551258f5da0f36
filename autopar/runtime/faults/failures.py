"""One line per failure: a peer that stopped answering, and errors under a launcher.

* ``peer_failures(operation, ranks, me)`` turns what gloo / NCCL / torch's pipelining raise when
  a peer dies or freezes — "Connection reset by peer", "Timed out waiting 30000ms", wrapped in
  "[Stage 0] failed to run backward" — into ``PeerLostError``: one line naming the rank that
  stopped answering (``autopar.runtime.faults.liveness``), the operation, and
  ``AUTOPAR_COLLECTIVE_TIMEOUT``, the setting that decides how long a frozen rank goes unnoticed.
* ``install_error_hook()``: under a launcher (torchrun, or any that sets ``RANK`` and
  ``WORLD_SIZE``) an ``AutoparError`` nobody catches prints ``autopar: error: <message>`` on one
  rank only — rank 0 for errors every rank raises alike (a plan refused before launch), the
  lowest surviving rank for a lost peer — and nothing on the others, instead of one traceback
  per rank. Every rank still exits with Python's status for an uncaught exception (1); the
  exception still propagates, so a script that catches it sees it as before.
"""
from __future__ import annotations

import os
import re
import sys
import time
from contextlib import contextmanager

from autopar.runtime.faults import liveness
from costmodels.contracts.errors import AutoparError

_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe",
         "connection refused", "remote worker", "socket closed", "ncclremoteerror")
_TIMEOUT = ("timed out", "timeout", "deadline exceeded")
QUIET_EXIT_DELAY_S = 10.0


class PeerLostError(AutoparError):
    """A rank of the plan died or stopped answering during a collective."""

    reporting_rank: int | None = None   # the one rank that prints it under a launcher


@contextmanager
def alike_on_every_rank():
    """Mark the AutoparError raised inside as one every rank raises alike (a check of the plan,
    the model or the batch), so that under a launcher only rank 0 prints it."""
    try:
        yield
    except AutoparError as e:
        e.same_on_every_rank = True
        raise


@contextmanager
def peer_failures(operation: str, ranks, me: int, timeout_s: float):
    """Re-raise a collective's dead-peer / timeout error as PeerLostError (others unchanged);
    ``operation`` is recorded as what this rank is doing (``rank_exit.doing``)."""
    from autopar.runtime.faults.rank_exit import doing
    try:
        with doing(operation):
            yield
    except AutoparError:
        raise
    except Exception as e:  # noqa: BLE001 — only peer failures are translated
        kind = failure_kind(e)
        if kind is None:
            raise
        stopped = liveness.stopped_ranks(ranks, me)
        err = PeerLostError(describe(kind, operation, e, stopped, timeout_s))
        alive = sorted(set(ranks) - set(stopped or ()))
        err.reporting_rank = alive[0] if alive else me
        raise err from e


def failure_kind(exc: BaseException) -> str | None:
    """"lost" (a peer's connection closed), "timeout" (no answer in time) or None."""
    import torch.distributed as dist
    texts, is_dist = [], False
    for e in _chain(exc):
        texts.append(str(e).lower())
        is_dist |= isinstance(e, (dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError))
    text = " ".join(texts)
    if not (is_dist or "gloo" in text or "nccl" in text):
        return None   # not from a collective backend: the user's error, left alone
    if any(s in text for s in _LOST):
        return "lost"
    if any(s in text for s in _TIMEOUT):
        return "timeout"
    return "lost" if is_dist else None  # a backend error of another kind


def describe(kind: str, operation: str, exc: BaseException, stopped, timeout_s: float) -> str:
    """The one line: who stopped answering, during what, and what to do."""
    if stopped:
        who = (f"rank {stopped[0]}" if len(stopped) == 1
               else "ranks " + ", ".join(str(r) for r in stopped))
    else:
        who = "a peer rank (which one is unknown: every heartbeat in the store still moves)" \
            if stopped == [] else "a peer rank (which one is unknown: no heartbeat store)"
    what = operation + (f" ({p})" if (p := _phase(exc)) else "")
    cause = _backend_message(exc)
    if kind == "timeout":
        return (f"{who} stopped answering during {what}: no reply within "
                f"AUTOPAR_COLLECTIVE_TIMEOUT={timeout_s:g} s ({cause}); it froze, hangs, or its "
                "step takes longer than that: see its log, or raise AUTOPAR_COLLECTIVE_TIMEOUT "
                "for slow steps")
    return (f"{who} stopped answering during {what}: its connection closed ({cause}); it died or "
            "was killed: see its log (a rank that freezes instead is noticed after "
            f"AUTOPAR_COLLECTIVE_TIMEOUT={timeout_s:g} s)")


def install_error_hook() -> None:
    """Under a launcher of more than one process, print an uncaught AutoparError once (module
    docstring). Installed once; other exceptions go to the previous hook unchanged."""
    if getattr(sys.excepthook, "autopar_hook", False):
        return
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    from autopar.runtime.faults.rank_exit import install_sigterm_report
    install_sigterm_report()   # a peer killed: torchrun SIGTERMs this rank; name the dead one first
    previous = sys.excepthook

    def hook(exc_type, value, tb):
        if not isinstance(value, AutoparError):
            return previous(exc_type, value, tb)
        rank = int(os.environ.get("RANK", "0"))
        printer = 0 if getattr(value, "same_on_every_rank", False) else getattr(
            value, "reporting_rank", None)
        if printer is None or printer == rank:
            print(f"autopar: error: {value}", file=sys.stderr, flush=True)
        else:   # let the printing rank print first: a launcher ends the rest once one exits
            time.sleep(QUIET_EXIT_DELAY_S)

    hook.autopar_hook = True
    sys.excepthook = hook


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _phase(exc: BaseException) -> str:
    """"stage 0 backward", "recv" …: where in the step it failed, from torch's messages."""
    for e in _chain(exc):
        m = re.search(r"\[stage (\d+)\] failed to run (forward|backward)", str(e), re.I)
        if m:
            return f"pipeline stage {m.group(1)} {m.group(2).lower()}"
        m = re.search(r"failed to run stage (forward|backward)", str(e), re.I)
        if m:
            return f"pipeline stage {m.group(1).lower()}"
    for e in _chain(exc):
        m = re.search(r"for (\w+) operation", str(e))
        if m:
            return m.group(1)
    return ""


def _backend_message(exc: BaseException) -> str:
    """The innermost error's text, without gloo's source location and its advice."""
    last = list(_chain(exc))[-1]
    text = " ".join(str(last).split())
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    text = re.split(r"\. This is typically|\. Check the logs", text)[0]
    return text[:160] or type(last).__name__
