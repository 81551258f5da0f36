"""The rank side of ``autopar validate``: what each spawned process runs and measures.

Kept apart from ``autopar.validate`` (which picks plans, predicts, spawns and summarises) so the
measuring loop — build, apply, warm up, timed steps, peak memory, model-state bytes — reads on
its own. See ``autopar.validate``'s docstring for the method.
"""
from __future__ import annotations

import gc
import os
import time
from typing import Any

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
    bar = _Bar(progress and rank == 0, len(plan_dicts) * (warmup + steps), "validate")
    out = []
    for i, pd in enumerate(plan_dicts):
        plan = Plan.from_dict(pd)
        rec: dict[str, Any] = {"index": i}
        runner = opt = None
        try:
            gc.collect()
            _malloc_trim()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            else:
                base = rss_bytes()
            runner = apply(src.build("cpu", seed=seed, attention=plan.attention), plan,
                           loss_fn=src.loss, spec=spec)
            opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)
            n = global_batch // runner.dp_size
            sl = slice(runner.dp_rank * n, (runner.dp_rank + 1) * n)
            x = tuple(t[sl] for t in inputs)
            y = targets[sl] if targets is not None else None
            gc.collect()
            _malloc_trim()
            hwm_reset = cuda or _reset_hwm()
            times, cpu = [], []
            for s in range(warmup + steps):
                bar.step(f"plan {i + 1}/{len(plan_dicts)} step {s + 1}")
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                    loss = runner.train_step(x, y)
                if s == warmup + steps - 1:  # count gradient bytes, off the clock
                    tp_, cp_ = time.perf_counter(), time.process_time()
                    grads = _state_bytes(runner, opt)["grads"]
                    t0 += time.perf_counter() - tp_
                    c0 += time.process_time() - cp_
                opt.step()
                opt.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            if cuda:
                peak = torch.cuda.max_memory_allocated() - base
                total = torch.cuda.max_memory_reserved()
            else:
                peak = rss_bytes("VmHWM") - base
                total = rss_bytes("VmHWM")
            rec.update(times=times, cpu=cpu, peak_bytes=peak, peak_total_bytes=total, baseline_bytes=base,
                       loss=loss, hwm_reset=hwm_reset)
            rec["state"] = dict(_state_bytes(runner, opt), grads=grads)
        except Exception as e:  # recorded; the other plans still run
            rec["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            del runner, opt
            gc.collect()
        # agree across ranks: step times (max), memory (max), any error
        ok = torch.tensor([0.0 if "error" in rec else 1.0], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item() == 1.0:
            t = torch.tensor(rec["times"] + rec["cpu"] + [float(rec["peak_bytes"]), float(rec["peak_total_bytes"])],
                             dtype=torch.float64, device=device)
            per_rank = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
            dist.all_gather(per_rank, t)
            per_rank = [p.tolist() for p in per_rank]
            k_ = len(rec["times"])
            rec["times_max"] = [max(p[k] for p in per_rank) for k in range(k_)]
            rec["cpu_max"] = [max(p[k_ + k] for p in per_rank) for k in range(k_)]
            rec["peak_bytes_per_rank"] = [p[-2] for p in per_rank]
            rec["peak_total_bytes_per_rank"] = [p[-1] for p in per_rank]
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
