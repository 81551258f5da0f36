"""What each rank of ``autopar profile`` measures (runs inside the spawned ranks; torch here).

All ranks measure at the same time, the way they train: on a CPU host each rank is one process
with one thread (the runtime's launcher sets ``torch.set_num_threads(1)``), so matmul and copy
rates are what one rank gets while the others are busy too. On a GPU each rank owns one GPU.

``autopar.profile.run.profile_rank`` runs these in order; ``kernels`` builds its rates on the
timing helpers here (``best_time``, ``agreed_int``, ``synchronize``). This
module imports neither, so the package's imports go one way: run → kernels → measure.

* matmul: square ``n×n @ n×n`` per dtype, ``2·n³`` FLOPs; 5 timed runs of about
  ``min_time_s / 5`` each, the best run's FLOP/s (timeit's rule: on a shared machine interference
  only adds time); the figure is the mean over ranks. With ``clock="cpu"`` (CPU hosts shared
  with other work) matmul and copy are timed by the thread's CPU time instead of wall time.
* memory bandwidth: ``dst.copy_(src)`` of a large fp32 buffer; bytes = 2 · size (read + write).
* collectives (fp32 buffers; ``S`` = whole buffer, nccl-tests' convention): all-reduce of S,
  all-gather of S/n per rank into S, reduce-scatter of S into S/n — both as autopar's tensor /
  sequence-parallel rewrite issues them (``autopar.rewrite.collectives``: with NCCL the native
  ``all_gather_into_tensor`` / ``reduce_scatter``; with gloo, whose native reduce-scatter is
  about 3.5× slower per byte than its all-reduce, an all-reduce + own chunk, and a list
  all-gather + ``cat``, copies included); torch's ``all_gather_into_tensor`` and
  ``reduce_scatter_tensor`` apart (what FSDP2, i.e. ZeRO-2/3, calls); p2p send/recv of S between
  ranks 0 and 1 (ping-pong, one-way time = round trip / 2). Each size: warm-up, then 5 runs of
  the same (agreed) repeat count; a run's time is the slowest rank's; the median run's time per
  op (``agreed_time`` says why not the best). Then each again at a few sizes *between
  compute*, the way a step issues it (``kernels.in_step_time``): the cost model's fit.
* element-wise / attention / cross-entropy / optimizer rates and comm-compute overlap: ``autopar.profile.kernels``.
* process footprint: resident memory (VmRSS) of a rank after importing torch and joining the
  process group, before any model exists (CPU) / CUDA memory in use but not allocated by
  tensors (GPU: context, NCCL).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's VmRSS / VmHWM from /proc/self/status (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class ProgressBar:
    """A rich progress bar on stderr for work done in spawned ranks (``autopar profile`` and
    ``autopar validate``): the ranks share one terminal, so only the one made with ``enabled``
    (rank 0) draws, and the others' calls do nothing, so that every rank runs the same code."""

    def __init__(self, enabled: bool, total: int, description: str):
        self.p = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.p = Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self.p.start()
            self.task = self.p.add_task(description, total=total)

    def step(self, description: str | None = None):
        if self.p is not None:
            self.p.update(self.task, advance=1, **({"description": description} if description else {}))

    def close(self):
        if self.p is not None:
            self.p.stop()


def synchronize(device):
    """Wait for the device's queued work (GPU kernels run asynchronously), so that a timer
    stops after the work it times; nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn, device, min_time_s: float, chunks: int = 5, min_reps: int = 2) -> tuple[float, float]:
    """(wall, cpu) seconds per call of fn: after a warm-up call, ``chunks`` timed runs of about
    ``min_time_s / chunks`` each; for each clock the best run's time per call (timeit's rule: on a
    shared machine interference only adds time, so the minimum is the closest to the intrinsic
    cost). ``cpu`` is this thread's CPU time (``time.thread_time``; on a GPU it equals wall)."""
    fn()
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(min_reps, int(min_time_s / chunks / one))
    best, best_cpu = float("inf"), float("inf")
    for _ in range(chunks):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            fn()
        synchronize(device)
        best = min(best, (time.perf_counter() - t0) / reps)
        best_cpu = min(best_cpu, (time.thread_time() - c0) / reps)
    return best, (best if device.type == "cuda" else best_cpu)


def plan_sizes(device_type: str, quick: bool) -> dict:
    if device_type == "cuda":
        mm = [256, 512, 1024, 2048, 4096, 8192] if quick else [128, 256, 512, 768, 1024, 1536, 2048,
                                                                 3072, 4096, 6144, 8192, 12288]
        coll = [2 ** k for k in range(3, 29, 5 if quick else 2)]      # 8 B .. 256 MiB
        in_step = [c for c in coll if c >= 1 << 16][::2]  # a subset of coll: its floor
        return dict(mm=mm, coll=coll, in_step=in_step, copy_bytes=(256 << 20) if quick else (1 << 30),
                    min_time_s=0.05 if quick else 0.2, dtypes=("bf16", "fp16", "fp32"))
    mm = [32, 64, 128, 256, 512, 1024] if quick else [32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
                                                       1024, 1536]
    coll = ([8, 64, 512, 4096, 32768, 262144, 2097152] if quick
            else [2 ** k for k in range(3, 27, 2)])                   # 8 B .. 32 MiB
    in_step = [4096, 262144, 2097152] if quick else [8192, 131072, 524288, 2097152, 8388608, 33554432]
    return dict(mm=mm, coll=coll, in_step=in_step, copy_bytes=(32 << 20) if quick else (256 << 20),
                min_time_s=0.05 if quick else 0.3, dtypes=("bf16", "fp32"))


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def collective_fn(kind: str, S: int, rank: int, n: int, device):
    """One call of collective ``kind`` over a whole buffer of ``S`` bytes (module docstring)."""
    from autopar.rewrite.collectives import all_gather_along_dim, reduce_scatter_along_dim
    numel = S // 4
    if kind == "all_reduce":
        x = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(x)
    if kind == "all_gather":   # as the TP rewrite issues them (module docstring)
        x = torch.ones(numel // n, device=device)
        return lambda: all_gather_along_dim(x, 0, dist.group.WORLD)
    if kind == "reduce_scatter":
        x = torch.ones(numel, device=device)
        return lambda: reduce_scatter_along_dim(x, 0, dist.group.WORLD)
    if kind == "all_gather_into_tensor":   # torch's flat collectives (FSDP2)
        x = torch.ones(numel // n, device=device)
        y = torch.empty(numel, device=device)
        return lambda: dist.all_gather_into_tensor(y, x)
    if kind == "reduce_scatter_tensor":
        x = torch.ones(numel, device=device)
        y = torch.empty(numel // n, device=device)
        return lambda: dist.reduce_scatter_tensor(y, x)
    x = torch.ones(numel, device=device)

    def ping_pong():
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        elif rank == 1:
            dist.recv(x, 0)
            dist.send(x, 0)
    return ping_pong


def agreed_int(x: int, device) -> int:
    """Rank 0's ``x`` on every rank (a repeat count all ranks must share)."""
    t = torch.tensor([x], dtype=torch.int64, device=device)
    dist.broadcast(t, 0)
    return int(t.item())


def agreed_time(fn, device, min_time_s: float, rank: int, n: int, p2p: bool,
                 chunks: int = 5) -> float:
    """Seconds per call, with the repeat count agreed by all ranks (a collective must be called
    the same number of times everywhere): a probe of 3 calls decides, on rank 0, how many per
    chunk; each of ``chunks`` runs is timed on every rank, its time is the slowest rank's, and
    the result is the MEDIAN run's time per call. Not the best run, as for compute (``best_time``):
    a training step issues hundreds of collectives, each paying the wake-up of the ranks' threads
    (on a 2-core VM about a scheduler tick, ~2 ms, in most runs and ~0.3 ms in the luckiest), so
    the typical run is what a step sees; the best one made TP plans look 3-5x cheaper than they
    ran."""
    if p2p and rank > 1:
        fn = lambda: None  # noqa: E731  ranks beyond 0 and 1 sit the ping-pong out
    fn()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    synchronize(device)
    probe = (time.perf_counter() - t0) / 3
    reps = agreed_int(max(2, min(5000, int(min_time_s / chunks / max(probe, 1e-7)))), device)
    runs = []
    for _ in range(chunks):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        synchronize(device)
        runs.append((time.perf_counter() - t0) / reps)
    el = torch.tensor(runs, dtype=torch.float64, device=device)
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    return float(el.median().item())
