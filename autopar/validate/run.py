"""``autopar validate``'s driver: run plans for real and set the measurements beside the predictions.

``validate(spec, hardware, nproc, global_batch, plans=None, steps=10, warmup=2) -> dict``

* **Predictions**: ``autopar.scoring.estimate_plans`` (trace + ``costmodels.model.estimate``) on the
  given profile, with the memory model in ``precision="amp"`` (what the ranks run: fp32 weights,
  grads and AdamW state, autocast's bf16 weight cache, the unfused fp32 loss, DDP / FSDP2 /
  pipelining buffers; ``"fp32"`` with ``amp=False``; costmodels/model/memory.py);
  ``predicted_step_s`` = its ``step_time_s``, ``predicted_memory_bytes`` = its
  ``memory_bytes.total − memory_bytes.reserve`` (what the plan itself puts in memory; the
  reserve is a constant per process and is reported apart).
* **Plans**: ``plans`` (a plans file, validate output, a list of plan dicts, …: whatever
  ``costmodels.contracts.plans_file.PlansFile.read`` accepts) or,
  without, ``default_plans``: a spread picked from ``autopar search``'s ranked plans covering every
  (dp, tp, pp) shape, several micro-batch sizes and every recompute policy.
* **Measurement**: ``nproc`` local ranks are spawned once (gloo on CPU, NCCL on GPU) and run every
  plan in the same processes (start-up shared). Per plan each rank builds the model from
  the same seed, ``autopar.apply``s the plan, makes an AdamW optimizer over ``runner.parameters()``
  and runs ``warmup`` untimed steps, one untimed *memory step* (after at least one step, so the
  optimizer state exists), its untimed tail and one untimed step for RSS, and keeps the plan;
  then ``steps`` timed rounds each run one optimizer step of every kept plan in turn
  (``autopar.validate.rank``: the machine's drift spreads over all plans instead of landing on
  some; on a GPU, whose memory holds every kept plan's state, each plan's timed steps run right
  after its preparation and the plan is freed), on the same global batch, under
  ``torch.autocast(bfloat16)`` (bf16 matmuls, fp32 weights, grads and AdamW state: 16 bytes of
  model state per parameter plus autocast's 2-byte weight cache; ``amp=False``: fp32).
  A step = ``train_step`` + ``opt.step()`` + ``opt.zero_grad()``, timed from a barrier; the
  step's time is the slowest rank's; ``measured_step_s`` is the fastest timed step (timeit's
  rule: on a shared machine interference only adds time; ``measured_step_s_median`` and every
  step's time are kept beside it).
* **Memory** per rank, *peak live tensor bytes* since before the model was built — GPU: torch's
  allocator ``max_memory_allocated`` minus ``memory_allocated`` before the model; CPU: the same
  meaning from the profiler's allocation events (``autopar.validate.live_bytes.LiveBytes``): their
  running sum from before the model is built to the end of the memory step, peak inside that
  step. ``measured_memory_bytes`` is the largest over ranks (the estimate is that of the most
  loaded GPU); ``measured_live_at_step_start_bytes`` is what was live when the step began (model
  state, buffers). ``measured_rss_growth_bytes`` (``VmHWM`` over one untimed step after the
  memory step minus ``VmRSS`` before the model) is kept beside it: it adds glibc's retained and
  fragmented heap, so it is not what the cost model predicts.
* **Summary**: step-time MAPE and Spearman rank correlation, memory MAPE / worst error / Spearman.

The result (``--json`` / ``-o``) is a plans file (docs/CONTRACTS.md) whose plans are the estimate
results plus the measured fields, with ``"validate": {summary and method}`` at the top, so
``autopar report`` reads it as it reads any plans file, and adds the predicted-vs-measured chart
(``autopar.report.validate_chart``).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from autopar.validate.rank import validate_rank
from autopar.validate.stats import mape, spearman
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import PLAN_FIELDS

__all__ = ["validate", "default_plans", "summarize", "mape", "spearman", "is_validate_output"]

PLAN_KEYS = PLAN_FIELDS   # what a plan is, beside the predictions and measurements


def is_validate_output(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("validate"), dict) and isinstance(data.get("plans"), list)


def _plan_key(d: dict) -> tuple:
    return tuple(json.dumps(d.get(k), sort_keys=True) for k in PLAN_KEYS)


def default_plans(spec: str, hardware, nproc: int, global_batch: int, seq: int | None = None,
                  count: int = 8) -> list[dict]:
    """A spread of ``count`` distinct plans from the search's ranked list, structure first: the
    best plan of every (dp, tp, pp) shape, then of every recompute policy, sequence-parallel
    setting, interleaving and ZeRO stage not yet covered, then the best unseen (shape,
    micro-batch), then the next best. Plans that differ in structure differ in time by more than
    plans that differ only in micro-batch, so the rank correlation measures the model rather
    than timing noise."""
    from autopar.search import search
    res = search(spec, hardware if isinstance(hardware, str) else hardware.path, nproc, global_batch,
                 seq=seq, top=400)
    # only plans predicted to fit: the ranked list may hold plans over the HBM, and on a 1×H100
    # two such picks (83.6 and 84.8 GiB predicted, 79 GiB card) ran out of memory, as predicted,
    # spending the run on plans nobody would launch
    cands = [c.prediction for c in res.plans if c.prediction.get("fits", True)]
    chosen: list[dict] = []
    seen: set = set()

    def take(pred):
        if len(chosen) < count and _plan_key(pred) not in seen:
            seen.add(_plan_key(pred))
            chosen.append(pred)

    def best_by(key):
        got = {}
        for p in cands:
            got.setdefault(key(p), p)
        return list(got.values())

    shape = lambda p: (p["dp"], p["tp"], p["pp"])  # noqa: E731
    for key in (shape, lambda p: p["recompute"],
                lambda p: (shape(p), p["sequence_parallel"]) if p["tp"] > 1 else None,
                lambda p: (shape(p), p["vpp"] > 1) if p["pp"] > 1 else None,
                lambda p: p["zero"] if p["dp"] > 1 else None,
                lambda p: (shape(p), p["recompute"]),
                lambda p: (shape(p), p["micro_batch_size"])):
        for p in best_by(key):
            take(p)
    for p in cands:
        take(p)
    return [{k: p[k] for k in PLAN_KEYS if k in p} for p in chosen]


def _median(xs):
    s = sorted(xs)
    k = len(s) // 2
    return s[k] if len(s) % 2 else 0.5 * (s[k - 1] + s[k])


def summarize(plans: list[dict]) -> dict:
    """MAPE / Spearman over the plans that ran (those with ``measured_step_s``); when the plans
    carry both clocks, ``by_clock`` has the step-time figures for each."""
    out = _summarize(plans, "measured_step_s")
    if all(p.get("measured_wall_step_s") for p in plans if p.get("measured_step_s")):
        out["by_clock"] = {c: {k: v for k, v in _summarize(plans, f"measured_{c}_step_s").items()
                               if k.startswith("step_time")} for c in ("wall", "cpu")}
    return out


def _summarize(plans: list[dict], key: str) -> dict:
    ok = [p for p in plans if p.get("measured_step_s")]
    ps, ms = [p["predicted_step_s"] for p in ok], [p[key] for p in ok]
    okm = [p for p in ok if p.get("measured_memory_bytes")]
    pm, mm = [p["predicted_memory_bytes"] for p in okm], [p["measured_memory_bytes"] for p in okm]
    mem_err = [abs(a - b) / b for a, b in zip(pm, mm)]
    return {"plans": len(plans), "plans_measured": len(ok),
            "step_time_mape": mape(ps, ms), "step_time_spearman": spearman(ps, ms),
            "step_time_max_error": max((abs(a - b) / b for a, b in zip(ps, ms)), default=float("nan")),
            "memory_mape": mape(pm, mm), "memory_max_error": max(mem_err, default=float("nan")),
            "memory_spearman": spearman(pm, mm)}


def validate(spec: str, hardware, nproc: int, global_batch: int, plans=None, *, steps: int = 10,
             warmup: int = 2, seq: int | None = None, seed: int = 0, progress: bool = True,
             count: int = 8, amp: bool = True, clock: str = "wall") -> dict:
    """Run ``plans`` (default: ``default_plans``) on ``nproc`` local ranks; see the module
    docstring. Returns a plans file with the measurements and ``"validate"`` (the summary)."""
    import torch

    from autopar.models import load_model
    from autopar.runtime.verify.serial import spawn
    from autopar.scoring import estimate_plans
    from costmodels.contracts.plan import Plan
    from costmodels.contracts.plans_file import PlansFile
    from costmodels.profiles.hardware_files import load_profile
    if nproc < 1:
        raise PlanError(f"--nproc {nproc} must be at least 1")
    if steps < 1 or warmup < 0:
        raise PlanError("--steps must be at least 1 and --warmup at least 0")
    profile = load_profile(hardware)
    source = load_model(spec, seq=seq)   # a bad spec fails here, before spawning
    seq = source.seq
    if plans is None:
        plan_dicts = default_plans(spec, profile.path or profile.name, nproc, global_batch, seq=seq,
                                   count=count)
    else:
        plan_dicts = [p.to_dict() for p in PlansFile.read(plans).plans]
    if not plan_dicts:
        raise PlanError("no plans to validate; pass --plans FILE with at least one plan")
    for d in plan_dicts:
        p = Plan.from_dict(d)
        if p.world_size != nproc:
            raise PlanError(f"plan dp·cp·tp·pp = {p.dp}·{p.cp}·{p.tp}·{p.pp} = {p.world_size} but --nproc is "
                            f"{nproc}; validate plans for {nproc} ranks (autopar search --gpus {nproc})")
        p.num_micro_batches(global_batch)
    preds = estimate_plans(spec, profile.path or profile.name, nproc, global_batch,
                           [Plan.from_dict(d) for d in plan_dicts], seq=seq,
                           precision="amp" if amp else "fp32")
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= nproc
    if torch.cuda.is_available() and not cuda:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("AUTOPAR_COLLECTIVE_TIMEOUT", "120")  # a stuck plan fails, not hangs
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    results = spawn(validate_rank, nproc, spec, seq, plan_dicts, global_batch, steps, warmup, seed,
                    progress, amp)
    wall = time.perf_counter() - t0
    r0 = results[0]
    out_plans = []
    for i, (pred, rec) in enumerate(zip(preds, r0)):
        d = dict(pred)
        mem = pred["memory_bytes"]
        d["predicted_step_s"] = pred["step_time_s"]
        d["predicted_memory_bytes"] = mem["total"] - mem["reserve"]
        d["predicted_memory_total_bytes"] = mem["total"]
        if "error" in rec:
            d["error"] = rec["error"]
            d["measured_step_s"] = None
            d["measured_memory_bytes"] = None
        else:
            timed = rec["times_max"][warmup:]
            wall_min = min(timed)
            cpu_timed = rec["cpu_max"][warmup:]
            d["measured_wall_step_s"] = wall_min
            d["measured_wall_step_s_median"] = _median(timed)
            d["measured_wall_step_s_all"] = timed
            d["measured_cpu_step_s"] = min(cpu_timed)
            d["measured_cpu_step_s_all"] = cpu_timed
            d["measured_step_s"] = wall_min if clock == "wall" else d["measured_cpu_step_s"]
            peaks = rec["peak_bytes_per_rank"]
            d["measured_rss_growth_bytes"] = max(rec["rss_growth_bytes_per_rank"])
            d["measured_rss_growth_bytes_per_rank"] = rec["rss_growth_bytes_per_rank"]
            st = [results[r][i].get("state") or {} for r in range(nproc)]
            worst = max(range(nproc), key=lambda r: peaks[r])
            mb = dict(st[worst])
            mb["activations_and_other"] = peaks[worst] - sum(st[worst].values())
            d["measured_memory_breakdown_bytes"] = mb
            if not cuda:  # live tensor bytes when the memory step began (model state, buffers)
                d["measured_live_at_step_start_bytes"] = rec["live_at_step_start_bytes_per_rank"][worst]
            d["measured_memory_bytes"] = max(peaks)
            d["measured_memory_bytes_per_rank"] = peaks
            d["measured_memory_total_bytes"] = max(rec["peak_total_bytes_per_rank"])
            d["step_time_error"] = d["predicted_step_s"] / d["measured_step_s"] - 1.0
            if d["measured_memory_bytes"] > 0:  # 0: the profiler saw nothing (unmeasured)
                d["memory_error"] = d["predicted_memory_bytes"] / d["measured_memory_bytes"] - 1.0
            else:
                d["measured_memory_bytes"] = None
            d["loss"] = rec["loss"]
        out_plans.append(d)
    # rank by measured step time (unmeasured last)
    order = sorted(range(len(out_plans)), key=lambda i: (out_plans[i]["measured_step_s"] is None,
                                                         out_plans[i]["measured_step_s"] or 0.0))
    out_plans = [out_plans[i] for i in order]
    for r, d in enumerate(out_plans, 1):
        d["rank"] = r
    summary = summarize(out_plans)
    method = {
        "device": "cuda" if cuda else "cpu",
        "backend": "nccl" if cuda else "gloo",
        "threads_per_rank": 1 if not cuda else None,
        "precision": ("torch.autocast bfloat16 (bf16 matmuls/activations), fp32 weights, grads and "
                      "AdamW state" if amp else "fp32, AdamW"),
        "step": "train_step + opt.step + opt.zero_grad from a barrier; slowest rank; best of "
                f"{steps} timed rounds (one step of every plan each) after {warmup} warm-up steps per plan",
        "clock": clock,
        "clock_meaning": ("wall clock (perf_counter)" if clock == "wall" else
                          "CPU time of the rank process (process_time: all its threads, user + "
                          "system), slowest rank: what the step costs the rank, without the time "
                          "other processes on a shared host take from it, and without time spent "
                          "blocked (pipeline bubbles, waiting on peers)"),
        "memory": ("peak live tensor bytes: torch.cuda.max_memory_allocated minus allocated before "
                   "the model (torch's allocator stats), largest rank" if cuda else
                   "peak live tensor bytes of one untimed step (torch profiler allocation events, "
                   "running sum from before the model was built), largest rank; "
                   "measured_rss_growth_bytes (VmHWM over one untimed step after the memory step minus VmRSS "
                   "before the model) beside it")
                  + "; predicted = estimate memory total minus the profile's memory_reserve_bytes, "
                    f"precision {'amp' if amp else 'fp32'}",
        "wall_s": round(wall, 2),
        "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    return {"version": 1, "model": spec, "hardware": profile.name, "hardware_path": profile.path,
            "gpus": nproc, "global_batch": global_batch, "seq": seq, "objective": "step_time",
            "optimal": False, "search_time_s": 0.0, "plans": out_plans,
            "validate": {"summary": summary, "steps": steps, "warmup": warmup, "seed": seed,
                         "method": method}}
