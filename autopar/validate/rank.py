"""The rank side of ``autopar validate``: what each spawned process runs and measures.

Kept apart from ``autopar.validate`` (which picks plans, predicts, spawns and summarises) so the
measuring loop — build, apply, warm up, one memory step, timed steps, model-state bytes — reads
on its own. See ``autopar.validate``'s docstring for the method.

Memory on CPU is *peak live tensor bytes*, the meaning ``torch.cuda.max_memory_allocated`` has
on a GPU, because the cost model predicts tensor bytes. torch 2.13 has no CPU allocator
statistics, but its profiler (``profile_memory=True``) records every allocation and free of
torch's CPU allocator as a ``[memory]`` event; their running sum in time order is the bytes
live since the window opened. The window opens before the model is built and closes after one
untimed *memory step* (preceded by at least one step, so the optimizer state exists and the step
is a steady one) and one more untimed step (its tail); the peak of the running sum inside the
memory step is the measurement. What the profiler does not see: allocations made on threads
other than the one that runs the step (the CPU autograd engine runs backward on the calling
thread, and gloo allocates its collective temporaries there too — tests/test_memory_precision.py
checks both), frees on such threads (gloo's worker often drops a collective's tensors last:
``live_peak`` counts a block whose address is allocated again while it looks live only at its
allocation; the tail step is there to re-allocate those addresses), malloc's own overhead and
non-tensor buffers. Peak RSS growth (``VmHWM`` over the timed steps minus ``VmRSS`` before the
model) is kept beside it: it adds the allocator's retained and fragmented heap, which is what
made it 2–4× the live bytes for small models.
"""
from __future__ import annotations

import contextlib
import gc
import os
import time
from typing import Any

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


def validate_rank(spec, seq, plan_dicts, global_batch, steps, warmup, seed, progress, amp):
    import warnings

    import torch
    import torch.distributed as dist

    from autopar.models import load_model
    from autopar.profile.measure import _Bar, rss_bytes
    from autopar.runtime import dist as adist
    from autopar.runtime.apply import apply
    from costmodels.plan import Plan
    warnings.filterwarnings("ignore")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    adist.ensure_initialized(int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    src = load_model(spec, seq=seq)
    inputs, targets = src.make_batch(global_batch, seed=seed)
    # import now what the plans import lazily, so no plan's memory growth includes module code
    import importlib
    for mod in ("torch.distributed.pipelining", "torch.distributed.fsdp", "torch.nn.parallel",
                "torch.fx", "torch.utils.checkpoint", "autopar.rewrite", "autopar.trace"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
    extra = 2 if warmup else 3   # the memory step, after at least one step, and its tail
    bar = _Bar(progress and rank == 0, len(plan_dicts) * (warmup + extra + steps), "validate")
    out = []
    for i, pd in enumerate(plan_dicts):
        plan = Plan.from_dict(pd)
        rec: dict[str, Any] = {"index": i}
        runner = opt = live = None
        try:
            gc.collect()
            _malloc_trim()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            base_rss = rss_bytes()
            times, cpu, state = [], [], {}

            def step(label: str, timed: bool = True, count: bool = False):
                bar.step(f"plan {i + 1}/{len(plan_dicts)} {label}")
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                    loss = runner.train_step(x, y)
                if count:   # gradients exist only between backward and zero_grad
                    state["grads"] = _state_bytes(runner, opt)["grads"]
                opt.step()
                opt.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize()
                if timed:
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                return loss

            with LiveBytes(enabled=not cuda) as live:
                runner = apply(src.build("cpu", seed=seed, attention=plan.attention), plan,
                               loss_fn=src.loss, spec=spec)
                opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)
                n = global_batch // runner.dp_size
                sl = slice(runner.dp_rank * n, (runner.dp_rank + 1) * n)
                x = tuple(t[sl] for t in inputs)
                y = targets[sl] if targets is not None else None
                gc.collect()   # the unsharded model apply dropped sits in reference cycles
                for s in range(warmup):   # timed, and dropped by validate
                    step(f"warm-up {s + 1}")
                if not warmup:
                    step("first step", timed=False)
                with live.step():
                    step("memory step", timed=False, count=True)
                step("memory tail", timed=False)   # re-allocates what gloo freed unseen
            try:
                peak_live, live_at_start = live.result()
            except Exception:  # noqa: BLE001  profiler API changed: memory unmeasured, times kept
                peak_live = live_at_start = 0
            live = None   # the profiler's events go before the timed steps
            gc.collect()
            _malloc_trim()
            hwm_reset = _reset_hwm()
            for s in range(steps):
                loss = step(f"step {s + 1}")
            rss_growth = rss_bytes("VmHWM") - base_rss
            if cuda:
                peak = torch.cuda.max_memory_allocated() - base
                total = torch.cuda.max_memory_reserved()
            else:
                peak, total = peak_live, rss_bytes("VmHWM")
            rec.update(times=times, cpu=cpu, peak_bytes=peak, peak_total_bytes=total,
                       rss_growth_bytes=rss_growth, live_at_step_start_bytes=live_at_start,
                       baseline_bytes=base_rss, loss=loss, hwm_reset=hwm_reset)
            rec["state"] = dict(_state_bytes(runner, opt), grads=state.get("grads", 0))
        except Exception as e:  # recorded; the other plans still run
            rec["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            del runner, opt, live
            gc.collect()
        # agree across ranks: step times (max), memory (max), any error
        ok = torch.tensor([0.0 if "error" in rec else 1.0], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item() == 1.0:
            mem_keys = ("peak_bytes", "peak_total_bytes", "rss_growth_bytes", "live_at_step_start_bytes")
            t = torch.tensor(rec["times"] + rec["cpu"] + [float(rec[k]) for k in mem_keys],
                             dtype=torch.float64, device=device)
            per_rank = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
            dist.all_gather(per_rank, t)
            per_rank = [p.tolist() for p in per_rank]
            k_ = len(rec["times"])
            rec["times_max"] = [max(p[k] for p in per_rank) for k in range(k_)]
            rec["cpu_max"] = [max(p[k_ + k] for p in per_rank) for k in range(k_)]
            for j, k in enumerate(mem_keys):
                rec[k + "_per_rank"] = [p[2 * k_ + j] for p in per_rank]
        elif "error" not in rec:
            rec["error"] = "failed on another rank"
        out.append(rec)
    bar.close()
    return out


def _tensor_bytes(ts) -> int:
    """Bytes held by these tensors' storages (each storage once; DTensor: the local shard)."""
    seen, total = set(), 0
    for t in ts:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        try:
            st = t.untyped_storage()
            key = (st.data_ptr(), st.nbytes())
            nbytes = st.nbytes()
        except Exception:  # noqa: BLE001
            key, nbytes = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total


def _state_bytes(runner, opt) -> dict:
    """Model state this rank holds, from the tensors themselves: parameters, gradients (call
    after backward, before zero_grad), optimizer state."""
    import torch
    params = runner._all_params()
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return {"params": _tensor_bytes(params), "grads": _tensor_bytes(p.grad for p in params),
            "optimizer": _tensor_bytes(state)}
