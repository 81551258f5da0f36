"""Which rank stopped answering: a heartbeat per process in the rendezvous store.

A failed collective tells a survivor only that *some* peer went away ("Connection reset by
peer [127.0.0.1]:33189") or did not answer in time; gloo's addresses are not ranks. So each
process increments its counter ``autopar/alive/<rank>`` in the store every ``INTERVAL_S`` from a
daemon thread (the thread keeps beating while the main thread waits inside a collective, since
waits release the GIL). After a failure, ``stopped_ranks`` reads the counters twice,
``WINDOW_S`` apart: a rank that died or froze (SIGKILL, SIGSTOP, a hung host) is one whose
counter did not move.

The store is a client of the one at ``MASTER_ADDR:MASTER_PORT`` (torchrun's agent store, or
rank 0's), else the default group's. When the store itself is gone — it lived in rank 0's
process, and rank 0 died — the answer is "the rank hosting it".
"""
from __future__ import annotations

import atexit
import datetime
import os
import threading
import time

INTERVAL_S = 0.25
WINDOW_S = 2.0
_KEY = "autopar/alive/{}"

_beat: _Heartbeat | None = None


class _Heartbeat:
    def __init__(self, store, rank: int):
        self.store, self.rank = store, rank
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="autopar-heartbeat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        key = _KEY.format(self.rank)
        while not self.stop.is_set():
            try:
                self.store.add(key, 1)
            except Exception:  # noqa: BLE001 — the store went away (its host ended): stop beating
                return
            self.stop.wait(INTERVAL_S)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=1.0)


def start(rank: int) -> None:
    """Start this process's heartbeat (once; later calls do nothing)."""
    global _beat
    if _beat is not None:
        return
    store = _store()
    if store is None:
        return
    _beat = _Heartbeat(store, rank)
    atexit.register(_beat.close)   # before interpreter shutdown: no thread left inside the store


def stopped_ranks(ranks, me: int) -> list[int] | None:
    """The ranks of ``ranks`` (other than ``me``) whose heartbeat did not move for
    ``WINDOW_S``; ``[]`` when all beat; ``None`` when nothing can be told (no heartbeat here,
    or the store is gone and did not live in rank 0)."""
    if _beat is None:
        return None
    others = [r for r in ranks if r != me]
    try:
        before = {r: _beat.store.add(_KEY.format(r), 0) for r in others}
        time.sleep(WINDOW_S)
        after = {r: _beat.store.add(_KEY.format(r), 0) for r in others}
    except Exception:  # noqa: BLE001 — the store is gone with its host
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return [0] if not agent_store and 0 in others else None
    return [r for r in others if after[r] == before[r]]


def _store():
    import torch.distributed as dist
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    try:
        if addr and port:
            return dist.TCPStore(addr, int(port), is_master=False,
                                 timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
        from torch.distributed.distributed_c10d import _get_default_store
        return _get_default_store()
    except Exception:  # noqa: BLE001 — no store to beat in: failures then name no rank
        return None
