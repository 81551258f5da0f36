"""What each rank of ``autopar profile`` measures (runs inside the spawned ranks; torch here).

All ranks measure at the same time, the way they train: on a CPU host each rank is one process
with one thread (the runtime's launcher sets ``torch.set_num_threads(1)``), so matmul and copy
rates are what one rank gets while the others are busy too. On a GPU each rank owns one GPU.

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
  op (``_agreed_time`` says why not the best). Then each again at a few sizes *between
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


class _Bar:
    """A rich progress bar on stderr, drawn by rank 0 only."""

    def __init__(self, enabled: bool, total: int, description: str):
        self.p = None
        if enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)
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


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, min_time_s: float, chunks: int = 5, min_reps: int = 2) -> tuple[float, float]:
    """(wall, cpu) seconds per call of fn: after a warm-up call, ``chunks`` timed runs of about
    ``min_time_s / chunks`` each; for each clock the best run's time per call (timeit's rule: on a
    shared machine interference only adds time, so the minimum is the closest to the intrinsic
    cost). ``cpu`` is this thread's CPU time (``time.thread_time``; on a GPU it equals wall)."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(min_reps, int(min_time_s / chunks / one))
    best, best_cpu = float("inf"), float("inf")
    for _ in range(chunks):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            fn()
        _sync(device)
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


def profile_rank(quick: bool, progress: bool, clock: str = "wall") -> dict:
    """Everything one rank measures (see the module docstring); the result is a plain dict."""
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        import os
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sz = plan_sizes(device.type, quick)
    cpu_clock = clock == "cpu" and device.type == "cpu"
    colls = ["all_reduce", "all_gather", "reduce_scatter", "all_gather_into_tensor",
             "reduce_scatter_tensor"] + (["p2p"] if n > 1 else [])
    total = (len(sz["dtypes"]) * len(sz["mm"]) + 2 + len(colls) * len(sz["coll"])
             + (n > 1) * (1 + len(colls) * len(sz["in_step"])))
    bar = _Bar(progress and rank == 0, total, "matmul")
    out: dict = {"rank": rank, "world_size": n, "device": device.type,
                 "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "backend": dist.get_backend(), "min_time_s": sz["min_time_s"],
                 "clock": "cpu" if cpu_clock else "wall"}
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(device)
        out["device_total_bytes"] = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.synchronize()
        free, tot = torch.cuda.mem_get_info(device)
        out["footprint_bytes"] = tot - free - torch.cuda.memory_allocated(device)
    else:
        out["footprint_bytes"] = rss_bytes()
    try:
        # ---- matmul -------------------------------------------------------------------
        mm: dict[str, list] = {}
        for dname in sz["dtypes"]:
            rows = []
            for nn in sz["mm"]:
                bar.step(f"matmul {dname} n={nn}")
                a = torch.randn(nn, nn, device=device).to(DTYPES[dname])
                b = torch.randn(nn, nn, device=device).to(DTYPES[dname])
                c = torch.empty(nn, nn, device=device, dtype=DTYPES[dname])
                dist.barrier()
                t, tc = _timed(lambda: torch.matmul(a, b, out=c), device, sz["min_time_s"])
                rows.append([nn, 2.0 * nn ** 3, 2.0 * nn ** 3 / (tc if cpu_clock else t)])
                del a, b, c
            mm[dname] = rows
        out["matmul"] = mm
        # ---- memory bandwidth -----------------------------------------------------------
        bar.step("memory bandwidth")
        numel = sz["copy_bytes"] // 4
        src = torch.ones(numel, device=device)
        dst = torch.empty_like(src)
        dist.barrier()
        t, tc = _timed(lambda: dst.copy_(src), device, max(sz["min_time_s"], 0.1))
        t = tc if cpu_clock else t
        out["copy"] = {"bytes": sz["copy_bytes"], "seconds": t, "bytes_per_s": 2.0 * sz["copy_bytes"] / t}
        del src, dst
        # ---- element-wise, attention, optimizer (autopar.profile.kernels) -------------------
        from costmodels.compute import OPTIMIZER_BYTES_PER_PARAM

        from autopar.profile import kernels
        bar.step("element-wise, attention, optimizer")
        dist.barrier()
        kt = max(sz["min_time_s"], 0.1)
        out["elementwise"] = kernels.elementwise_rate(device, kt, cpu_clock)
        out["attention"] = kernels.attention_rate(device, kt, cpu_clock)
        out["cross_entropy"] = kernels.cross_entropy_rate(device, kt, cpu_clock)
        out["optimizer"] = kernels.optimizer_rate(device, kt, cpu_clock, OPTIMIZER_BYTES_PER_PARAM)
        # ---- collectives ------------------------------------------------------------------
        coll: dict[str, list] = {}
        for kind in colls:
            rows = []
            for S in sz["coll"]:
                bar.step(f"{kind} {S} B")
                S = max(S - S % (4 * n), 4 * n)  # whole fp32 elements, divisible by n
                fn = _collective_fn(kind, S, rank, n, device)
                dist.barrier()
                t = _agreed_time(fn, device, sz["min_time_s"], rank, n, p2p=kind == "p2p")
                rows.append([S, t / 2.0 if kind == "p2p" else t])  # p2p: round trip -> one way
            coll[kind] = rows
        out["collectives"] = coll
        from autopar.profile.kernels import fsdp_reduce_fns, fsdp_unshard_fn, in_step_time
        in_step: dict[str, list] = {}
        for kind in colls if n > 1 else ():
            b2b = dict((r[0], r[1]) for r in coll[kind])
            rows = []
            for S in sz["in_step"]:
                bar.step(f"{kind} {S} B between compute")
                S = max(S - S % (4 * n), 4 * n)
                base = None
                if kind == "all_gather_into_tensor":   # as FSDP2 issues them (kernels docstring)
                    fn = fsdp_unshard_fn(S, device, n)
                elif kind == "reduce_scatter_tensor":
                    fn, base = fsdp_reduce_fns(S, device, n)
                else:
                    fn = _collective_fn(kind, S, rank, n, device)
                half = 2.0 if kind == "p2p" else 1.0
                t = in_step_time(fn, device, b2b.get(S, 0.0) * half, base=base) / half
                rows.append([S, t])
            in_step[kind] = rows
        out["in_step"] = in_step
        if n > 1:
            bar.step("comm / compute overlap")
            out["overlap"] = kernels.comm_overlap(device)
    finally:
        bar.close()
    return out


def _collective_fn(kind: str, S: int, rank: int, n: int, device):
    """One call of collective ``kind`` over a whole buffer of ``S`` bytes (module docstring)."""
    from autopar.rewrite.collectives import _all_gather as rw_all_gather
    from autopar.rewrite.collectives import _reduce_scatter as rw_reduce_scatter
    numel = S // 4
    if kind == "all_reduce":
        x = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(x)
    if kind == "all_gather":   # as the TP rewrite issues them (module docstring)
        x = torch.ones(numel // n, device=device)
        return lambda: rw_all_gather(x, 0, dist.group.WORLD)
    if kind == "reduce_scatter":
        x = torch.ones(numel, device=device)
        return lambda: rw_reduce_scatter(x, 0, dist.group.WORLD)
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


def _agreed_int(x: int, device) -> int:
    """Rank 0's ``x`` on every rank (a repeat count all ranks must share)."""
    t = torch.tensor([x], dtype=torch.int64, device=device)
    dist.broadcast(t, 0)
    return int(t.item())


def _agreed_time(fn, device, min_time_s: float, rank: int, n: int, p2p: bool,
                 chunks: int = 5) -> float:
    """Seconds per call, with the repeat count agreed by all ranks (a collective must be called
    the same number of times everywhere): a probe of 3 calls decides, on rank 0, how many per
    chunk; each of ``chunks`` runs is timed on every rank, its time is the slowest rank's, and
    the result is the MEDIAN run's time per call. Not the best run, as for compute (``_timed``):
    a training step issues hundreds of collectives, each paying the wake-up of the ranks' threads
    (on a 2-core VM about a scheduler tick, ~2 ms, in most runs and ~0.3 ms in the luckiest), so
    the typical run is what a step sees; the best one made TP plans look 3-5x cheaper than they
    ran."""
    if p2p and rank > 1:
        fn = lambda: None  # noqa: E731  ranks beyond 0 and 1 sit the ping-pong out
    fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    _sync(device)
    probe = (time.perf_counter() - t0) / 3
    reps = _agreed_int(max(2, min(5000, int(min_time_s / chunks / max(probe, 1e-7)))), device)
    runs = []
    for _ in range(chunks):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(device)
        runs.append((time.perf_counter() - t0) / reps)
    el = torch.tensor(runs, dtype=torch.float64, device=device)
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    return float(el.median().item())
