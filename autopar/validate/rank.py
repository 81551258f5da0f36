"""The rank side of ``autopar validate``: what each spawned process runs and measures.

Kept apart from ``autopar.validate`` (which picks plans, predicts, spawns and summarises) so the
measuring loop reads on its own. See ``autopar.validate``'s docstring for the method. Two phases:

1. **Per plan**: build, apply, warm up, one untimed memory step and its tail
   (``autopar.validate.live_bytes``: peak live tensor bytes), model-state bytes, then one untimed
   step for RSS growth (after the profiler has closed). The plan's runner and optimizer are
   kept; the process's peak RSS is reported as if the plan ran alone (the other kept plans'
   resident bytes taken off).
2. **Timed rounds**: each round runs one timed step of every kept plan in turn. A 2-core VM
   drifts by 5–10 % over the minute a validation takes (the host's other tenants, the
   allocator's state); timed one plan after another, that drift landed on whole plans and
   reordered plans 5 % apart. Interleaved, every plan samples the same minutes. On a GPU every
   kept plan would hold its state in device memory, so there each plan's timed steps run right
   after its preparation and the plan is freed, as before.
"""
from __future__ import annotations

import gc
import os
import time
from typing import Any

from autopar.validate.live_bytes import LiveBytes, _malloc_trim, _reset_hwm

__all__ = ["validate_rank"]


def validate_rank(spec, seq, plan_dicts, global_batch, steps, warmup, seed, progress, amp):
    import warnings

    import torch
    import torch.distributed as dist

    from autopar.models import load_model
    from autopar.profile.measure import ProgressBar as _Bar
    from autopar.profile.measure import rss_bytes
    from autopar.runtime.faults import dist as adist
    warnings.filterwarnings("ignore")
    cuda = torch.cuda.is_available()
    if cuda:
        from autopar.runtime.step.gpu_defaults import set_env
        set_env()   # as autopar's runtime runs (gpu_defaults.py: expandable segments unless set)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    adist.ensure_initialized(int(os.environ["WORLD_SIZE"]))
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
    extra = 3 if warmup else 4   # the memory step (after at least one step), its tail, the RSS step
    bar = _Bar(progress and dist.get_rank() == 0, len(plan_dicts) * (warmup + extra + steps), "validate")
    # CPU: timed rounds over all plans (module docstring); GPU: one plan at a time, as before,
    # because every kept plan holds its model and optimizer state on the device
    rounds = not cuda
    first_rss = rss_bytes()
    out: list[dict[str, Any]] = []
    kept: list[_Live] = []
    for i, pd in enumerate(plan_dicts):
        rec: dict[str, Any] = {"index": i, "times": [], "cpu": []}
        live_plan = _prepare(i, pd, rec, src, inputs, targets, warmup, global_batch, seed, spec,
                             amp, device, bar, len(plan_dicts), rss_bytes, first_rss)
        out.append(rec)
        if _agreed_ok([live_plan is not None], device)[0]:   # failed anywhere: dropped everywhere
            kept.append(live_plan)
            if not rounds:
                _timed_rounds(kept, out, steps, bar, device)
                kept.clear()
        else:
            rec.setdefault("error", "failed on another rank")
        del live_plan
        gc.collect()
    _timed_rounds(kept, out, steps, bar, device)
    del kept
    gc.collect()
    bar.close()
    return [_agree(rec, device) for rec in out]


def _agreed_ok(flags: list[bool], device) -> list[bool]:
    """Each flag AND-ed over the ranks (one all-reduce)."""
    import torch
    import torch.distributed as dist
    if not flags:
        return []
    t = torch.tensor([1.0 if f else 0.0 for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return [bool(x) for x in t.tolist()]


def _timed_rounds(kept: list, out: list, steps: int, bar, device) -> None:
    """``steps`` rounds of one timed step of every plan in ``kept``. After each round the ranks
    agree which plans failed, so every rank drops the same ones and the next round's collectives
    pair up (a failure after a step's last collective, say in one rank's ``opt.step``, would
    otherwise leave the ranks stepping different plans)."""
    for s in range(steps):
        failed = []
        for lp in kept:
            bar.step(f"round {s + 1}/{steps} plan {lp.index + 1}")
            try:
                lp.step(timed=True)
                failed.append(False)
            except Exception as e:  # noqa: BLE001  recorded; the other plans still run
                out[lp.index]["error"] = f"{type(e).__name__}: {e}"[:500]
                failed.append(True)
        ok = _agreed_ok([not f for f in failed], device)
        for lp, good in zip(list(kept), ok):
            if not good:
                out[lp.index].setdefault("error", "failed on another rank")
                kept.remove(lp)
    for lp in kept:
        out[lp.index]["loss"] = lp.loss


class _Live:
    """A plan ready to step: its runner, optimizer and this dp rank's share of the batch."""

    def __init__(self, index, runner, opt, x, y, amp, device, rec):
        self.index, self.runner, self.opt, self.x, self.y = index, runner, opt, x, y
        self.amp, self.device, self.rec, self.loss = amp, device, rec, None

    def step(self, timed: bool, count: bool = False):
        import torch
        import torch.distributed as dist
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            self.loss = self.runner.train_step(self.x, self.y)
        if count:   # gradients exist only between backward and zero_grad
            self.rec["grads"] = _state_bytes(self.runner, self.opt)["grads"]
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if timed:
            self.rec["times"].append(time.perf_counter() - t0)
            self.rec["cpu"].append(time.process_time() - c0)


def _prepare(i, pd, rec, src, inputs, targets, warmup, global_batch, seed, spec, amp, device,
             bar, n_plans, rss_bytes, first_rss):
    """Phase 1 of one plan (module docstring); returns the kept plan, or None with
    ``rec["error"]`` set."""
    import torch

    from autopar.runtime.apply import apply
    from costmodels.contracts.plan import Plan
    cuda = device.type == "cuda"
    live = lp = None
    try:
        plan = Plan.from_dict(pd)
        gc.collect()
        _malloc_trim()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        base_rss = rss_bytes()

        def step(label, **kw):
            bar.step(f"plan {i + 1}/{n_plans} {label}")
            lp.step(**kw)

        with LiveBytes(enabled=not cuda) as live:
            # On a GPU a built-in model starts on meta and apply materialises it row by row on
            # the device: a CPU init of each plan's copy of a 2 B model cost more than its steps
            # (one H200, 2026-11-28). On a CPU the CPU build is kept (its bytes are measured).
            model = (src.build_meta(attention=plan.attention) if cuda and src.config is not None
                     else src.build("cpu", seed=seed, attention=plan.attention))
            runner = apply(model, plan, loss_fn=src.loss, spec=spec)
            # apply keeps only this rank's rows (and their tp shards) and drops the model; a
            # reference held here kept every other stage's weights live through the memory
            # step: measured +28.8 MB on each rank of pp2 (gpt 8 layers, hidden 384), the
            # weights of the stage the rank does not run, which autopar's runtime never holds
            del model
            opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)
            n = global_batch // runner.dp_size
            sl = slice(runner.dp_rank * n, (runner.dp_rank + 1) * n)
            x = tuple(t[sl] for t in inputs)
            y = targets[sl] if targets is not None else None
            lp = _Live(i, runner, opt, x, y, amp, device, rec)
            gc.collect()   # the unsharded model apply dropped sits in reference cycles
            for s in range(warmup):   # timed, and dropped by validate
                step(f"warm-up {s + 1}", timed=True)
            if not warmup:
                step("first step", timed=False)
            with live.step():
                step("memory step", timed=False, count=True)
            step("memory tail", timed=False)   # re-allocates what gloo freed unseen
        try:
            peak_live, live_at_start = live.result()
        except Exception:  # noqa: BLE001  profiler API changed: memory unmeasured, times kept
            peak_live = live_at_start = 0
        live = None   # the profiler's events go before the RSS step and the timed rounds
        gc.collect()
        _malloc_trim()
        hwm_reset = _reset_hwm()   # RSS growth over one step, without the build or the profiler
        step("RSS step", timed=False)
        hwm = rss_bytes("VmHWM")
        rss_growth = hwm - base_rss
        if cuda:
            peak = torch.cuda.max_memory_allocated() - base
            total = torch.cuda.max_memory_reserved()
        else:   # the process's peak as if this plan ran alone: other kept plans' RSS taken off
            peak, total = peak_live, hwm - base_rss + first_rss
        rec.update(peak_bytes=peak, peak_total_bytes=total, rss_growth_bytes=rss_growth,
                   live_at_step_start_bytes=live_at_start, baseline_bytes=base_rss,
                   hwm_reset=hwm_reset)
        rec["state"] = dict(_state_bytes(runner, opt), grads=rec.pop("grads", 0))
        return lp
    except Exception as e:  # noqa: BLE001  recorded; the other plans still run
        rec["error"] = f"{type(e).__name__}: {e}"[:500]
        return None
    finally:
        del live
        gc.collect()


def _agree(rec: dict, device) -> dict:
    """Across ranks: step times (max per step), memory figures (per rank), any error."""
    import torch
    import torch.distributed as dist
    if not _agreed_ok(["error" not in rec], device)[0]:
        rec.setdefault("error", "failed on another rank")
        return rec
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
    return rec
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
