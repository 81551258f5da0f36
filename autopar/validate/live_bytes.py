"""Peak live tensor bytes on a CPU, the meaning ``torch.cuda.max_memory_allocated`` has on a
GPU (the cost model predicts tensor bytes), for ``autopar validate``'s ranks.

torch 2.13 has no CPU allocator statistics, but its profiler (``profile_memory=True``) records
every allocation and free of torch's CPU allocator as a ``[memory]`` event; their running sum in
time order is the bytes live since the window opened. ``autopar.validate.rank`` opens the window
before the model is built and closes it after one untimed *memory step* (preceded by at least
one step, so the optimizer state exists and the step is a steady one) and one more untimed step
(its tail); the peak of the running sum inside the memory step is the measurement. What the
profiler does not see: allocations made on threads other than the one that runs the step (the
CPU autograd engine runs backward on the calling thread, and gloo allocates its collective
temporaries there too — tests/test_memory_precision.py checks both), frees on such threads
(gloo's worker often drops a collective's tensors last: ``live_peak`` counts a block whose
address is allocated again while it looks live only at its allocation; the tail step is there
to re-allocate those addresses), malloc's own overhead and non-tensor buffers. The tail step
does not always re-allocate such an address (large blocks are mmapped; a new one may land
elsewhere): then the block counts as live through the memory step, on some ranks and runs and
not others. Seen on 2 gloo ranks of one plan (gpt 8 layers of 384, dp2 ZeRO-1, 2026-11-28):
289.6 MB on one rank, 318.4 on the other, whose bytes live at the step's start were 28.8 MB
higher, the size of the ZeRO-1 post-step broadcast buffer of that rank's half of the weights;
the same plan alone measured 289.6 on both. Data-parallel replicas of a plan hold nearly the
same bytes (a ZeRO shard differs by at most a tensor), so a larger spread between them is this.
"""
from __future__ import annotations

import contextlib
import os

MEMORY_STEP = "autopar.validate.memory_step"


def _malloc_trim():
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _quiet_stderr():
    """fd 2 to /dev/null (kineto prints a line to the C stderr at each profiler start / stop)."""
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class LiveBytes:
    """Live CPU tensor bytes from the profiler's allocation events (see the module docstring).

    ``with LiveBytes() as lb: ...; with lb.step(): <the memory step>`` then ``lb.result()`` ->
    ``(peak, at_start)``: the most bytes live during the step and the bytes live when it began,
    both counted from the window's opening (allocations made before it are not counted, nor are
    their frees). ``enabled=False`` measures nothing (GPU: the allocator has its own stats)."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.prof = enabled, None

    def __enter__(self):
        if self.enabled:
            from torch.profiler import ProfilerActivity, profile
            self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with _quiet_stderr():
                self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.prof is not None:
            with _quiet_stderr():
                self.prof.__exit__(*exc)
        return False

    def step(self):
        import torch
        return torch.profiler.record_function(MEMORY_STEP) if self.enabled else contextlib.nullcontext()

    def result(self) -> tuple[int, int]:
        """(peak live bytes in the memory step, live bytes at its start)."""
        if self.prof is None:
            return 0, 0
        from torch._C._profiler import _EventType
        span, allocs, todo = None, [], list(self.prof.profiler.kineto_results.experimental_event_tree())
        while todo:
            e = todo.pop()
            todo.extend(e.children)
            if e.tag == _EventType.Allocation:
                f = e.extra_fields
                if str(f.device) == "cpu":
                    allocs.append((e.start_time_ns, f.ptr, f.alloc_size))
            elif e.name == MEMORY_STEP and span is None:
                span = (e.start_time_ns, e.end_time_ns)
        if span is None:
            raise RuntimeError("the profiler did not record the memory step")
        return live_peak(sorted(allocs, key=lambda a: a[0]), *span)


def live_peak(allocs, t0: int, t1: int) -> tuple[int, int]:
    """(peak, at_start) of the bytes live in [t0, t1] from ``(time, ptr, ±bytes)`` events in time
    order. A free counts only when its block was allocated in the window: the profiler also
    reports frees of blocks an *earlier* profiling session saw allocated (an earlier plan's).
    Some frees are never reported: gloo's worker thread, which the profiler does not watch,
    drops the last reference to a collective's tensors when the caller has already dropped its
    own. Such a block shows up when its address is allocated again while it still looks live;
    it is counted at its allocation only (as freed at once: these are the buffers and clones a
    collective uses and its caller drops right after it)."""
    live: dict[int, int] = {}
    ghost: set[int] = set()
    for i, (_, ptr, n) in enumerate(allocs):   # allocations whose free went unreported
        if n > 0:
            if ptr in live:
                ghost.add(live[ptr])
            live[ptr] = i
        else:
            live.pop(ptr, None)
    sizes: dict[int, int] = {}
    total, at_start, peak = 0, None, 0
    for i, (t, ptr, n) in enumerate(allocs):
        if t > t1:
            break
        if t >= t0 and at_start is None:
            at_start = peak = total
        if i in ghost:
            if t >= t0:
                peak = max(peak, total + n)
            continue
        if n > 0:
            sizes[ptr] = n
            total += n
        elif ptr in sizes:
            total -= sizes.pop(ptr)
        if t >= t0:
            peak = max(peak, total)
    if at_start is None:   # nothing allocated or freed in the step
        at_start = peak = total
    return peak, at_start
