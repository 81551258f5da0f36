"""Plan-space equivalence: plans from the space the search explores, run in one shared gloo world
and compared with the serial model.

``plan_grid()`` lists the grid (270 plans, then the context parallel and HSDP plans of
``long_sequence_grid`` and the expert parallel plans of ``expert_grid``): for each (dp, tp, pp)
in {1, 2}³ every schedule
(pp = 2: GPipe, 1F1B, and with vpp = 2 interleaved 1F1B, interleaved zero-bubble, ZB-V and
DualPipeV), micro-batch counts 1, pp, 2·pp and 3 (odd), and every
ZeRO stage (dp = 2); the other switches — model (gpt with a tied head, llama with grouped-query
attention, a gpt whose 3 heads tp = 2 cannot split), micro-batch size, recompute, sequence
parallel, placement, uneven split points — rotate through their values along the grid, so each
value meets many of the others. ``sample(grid, n, seed)`` draws from it.

``refusal(case)`` is the runtime's own pre-launch check (``autopar.runtime.assemble.prelaunch``) in this
process: the one line a refused plan gets, or None. ``run(cases, world)`` refuses what it must
before anything starts, then spawns one world of ``world`` processes and runs every other case on
its first dp·cp·tp·pp ranks (``world_loop``; the others wait at a barrier), comparing losses and the
gathered parameters with the single-process model. ``tests/test_runtime_parallel.py`` samples
the grid in CI; ``benchmarks/bench_runtime_sweep.py`` runs it whole.
"""
from __future__ import annotations

import itertools
import os
import random
import time
from dataclasses import dataclass, field

import torch

MODELS = {
    "gpt": "gpt:layers=3,hidden=32,heads=4,vocab=64,seq=8,tied=true,dropout=0",
    "llama": "llama:layers=3,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8",
    "gpt3h": "gpt:layers=3,hidden=24,heads=3,vocab=64,seq=8,dropout=0",
}
# models that cases may name (a MoE, one leading dense block, shared expert: expert parallelism,
# drawn by ``plan_grid`` only in its ``expert_grid``)
CASE_MODELS = {**MODELS,
               "moe": "moe:layers=3,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8,experts=4,top_k=2,"
                      "expert_ffn=16,shared_experts=1,dense_layers=1"}
RTOL, PARAM_RTOL = 1e-5, 1e-4
PARAM_FLOOR = 1e-3
_RECOMPUTE = ("none", "selective", "full")
_PLACEMENTS = ("tp,dp,pp", "dp,tp,pp", "tp,pp,dp")
_UNEVEN = {2: ((0, 1), (1, 5)), 4: ((0, 1), (1, 2), (2, 3), (3, 5))}  # 5 rows: emb, 3 blocks, head


@dataclass(frozen=True)
class SweepCase:
    model: str                      # a key of MODELS
    plan: tuple                     # sorted (field, value) pairs: hashable, picklable
    micro_batches: int              # per step

    @property
    def plan_dict(self) -> dict:
        return {k: [list(s) for s in v] if k == "stages" else v for k, v in self.plan}

    @property
    def name(self) -> str:
        return (f"{self.model}-" + "-".join(f"{k}{_short(v)}" for k, v in self.plan)
                + f"-m{self.micro_batches}")


def _short(v) -> str:
    if v is True:
        return ""
    if isinstance(v, tuple):
        return "[" + ";".join(f"{a}:{b}" for a, b in v) + "]"
    return str(v)


def plan_grid() -> list[SweepCase]:
    """The grid (module docstring), in a fixed order."""
    out = []
    models = list(MODELS)
    for i, (dp, tp, pp) in enumerate(itertools.product((1, 2), (1, 2), (1, 2))):
        schedules = [("1f1b", 1)] if pp == 1 else [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                                    ("interleaved-zb", 2), ("zb-v", 2), ("dualpipe-v", 2)]
        counts = sorted({1, pp, 2 * pp, 3})
        zeros = (0, 1, 2, 3) if dp > 1 else (0,)
        for (schedule, vpp), m, zero in itertools.product(schedules, counts, zeros):
            k = len(out)
            plan = dict(dp=dp, tp=tp, pp=pp, vpp=vpp, schedule=schedule, zero=zero,
                        micro_batch_size=1 + k % 2, recompute=_RECOMPUTE[k % 3])
            if tp > 1 and (k // 3) % 2:
                plan["sequence_parallel"] = True
            if dp * tp * pp > 1:
                plan["placement"] = _PLACEMENTS[(k // 2) % 3]
            if pp > 1 and k % 3 == 1:
                plan["stages"] = _UNEVEN[pp * vpp]
            out.append(SweepCase(models[(k + i) % len(models)], tuple(sorted(plan.items())), m))
    cases = out + long_sequence_grid(len(out))
    return cases + expert_grid(len(cases))


def expert_grid(start: int = 0) -> list[SweepCase]:
    """Expert parallel plans of the ``moe`` model (world <= 4): ep = 2 with (dp, tp, pp) in
    (2, 1, 1), (2, 2, 1), (2, 1, 2), (4, 1, 1) — tp on the dense parts, with or without
    sequence parallel — and ep taken from tp (ep·etp dividing dp·cp·tp, not dp·cp:
    ``autopar.runtime.step.expert_mesh``): ep = 4 over dp 2 · tp 2, ep = 2 over tp 2 · pp 2;
    every ZeRO stage (dp > 1), GPipe and 1F1B (pp = 2); recompute, micro-batch size and placement rotate
    as in ``plan_grid``."""
    out = []
    for dp, tp, pp, ep in ((2, 1, 1, 2), (2, 2, 1, 2), (2, 1, 2, 2), (4, 1, 1, 2), (2, 2, 1, 4), (1, 2, 2, 2)):
        schedules = ("1f1b",) if pp == 1 else ("gpipe", "1f1b")
        for schedule, zero in itertools.product(schedules, (0, 1, 2, 3) if dp > 1 else (0,)):
            k = start + len(out)
            plan = dict(dp=dp, tp=tp, pp=pp, ep=ep, schedule=schedule, zero=zero,
                        micro_batch_size=1 + k % 2, recompute=_RECOMPUTE[k % 3],
                        placement=_PLACEMENTS[(k // 2) % 3])
            if tp > 1 and (k // 3) % 2:
                plan["sequence_parallel"] = True
            out.append(SweepCase("moe", tuple(sorted(plan.items())), 2 * pp if pp > 1 else 1 + k % 2))
    return out


def long_sequence_grid(start: int = 0) -> list[SweepCase]:
    """Context parallel and HSDP plans (world <= 8): cp = 2 with each (dp, tp, pp) in {1, 2}³
    of dp·tp·pp <= 4, every ZeRO stage (dp = 2) and both 1F1B and interleaved 1F1B (pp = 2);
    HSDP dp = 4 as 2 replicas × 2 shards (zero 1, 2, 3) with tp or pp of 1 or 2, and with
    cp = 2. The other switches rotate as in ``plan_grid``."""
    out = []
    models = list(MODELS)
    combos = [(dp, tp, pp, 2, None) for dp, tp, pp in itertools.product((1, 2), (1, 2), (1, 2))
              if dp * tp * pp <= 4]
    combos += [(4, tp, pp, 1, 2) for tp, pp in ((1, 1), (2, 1), (1, 2))] + [(4, 1, 1, 2, 2)]
    for i, (dp, tp, pp, cp, shard) in enumerate(combos):
        schedules = [("1f1b", 1)] if pp == 1 else [("1f1b", 1), ("interleaved-1f1b", 2)]
        zeros = (0, 1, 2, 3) if dp > 1 and shard is None else (1, 2, 3) if shard else (0,)
        for (schedule, vpp), zero in itertools.product(schedules, zeros):
            k = start + len(out)
            plan = dict(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, schedule=schedule, zero=zero,
                        micro_batch_size=1 + k % 2, recompute=_RECOMPUTE[k % 3])
            if shard:
                plan["dp_shard"] = shard
            if cp == 1:
                del plan["cp"]
            if tp > 1 and (k // 3) % 2:
                plan["sequence_parallel"] = True
            plan["placement"] = _PLACEMENTS[(k // 2) % 3]
            m = 2 * pp if pp > 1 else 1 + k % 2
            out.append(SweepCase(models[(k + i) % len(models)], tuple(sorted(plan.items())), m))
    return out


def sample(cases: list[SweepCase], runnable: int, refused: int, seed: int) -> list[SweepCase]:
    """A random draw (``seed``) of ``runnable`` cases the rules of ``costmodels.contracts.runnable``
    accept and ``refused`` cases they refuse, so a sample always runs enough plans; the
    runtime's own pre-launch check then decides again (``run``), so a rule and the runtime
    that disagree show up as a refused plan that should have run, or the reverse."""
    order = cases[:]
    random.Random(seed).shuffle(order)
    ok = [c for c in order if rules_accept(c)]
    bad = [c for c in order if not rules_accept(c)]
    return ok[:runnable] + bad[:refused]


def rules_accept(case: SweepCase) -> bool:
    """``costmodels.contracts.runnable.check_runnable`` with the sizes of the case's model config."""
    from autopar.models import load_model
    from autopar.runtime.assemble.prelaunch import config_dims
    from costmodels.contracts.errors import PlanError
    from costmodels.contracts.plan import Plan
    from costmodels.contracts.runnable import check_runnable
    cfg = load_model(CASE_MODELS[case.model]).config
    dims = config_dims(cfg, cfg.layers + 2)   # rows: embedding, blocks, head
    try:
        check_runnable(Plan.from_dict(case.plan_dict), dims, case.micro_batches)
    except PlanError:
        return False
    return True


def refusal(case: SweepCase, make_case=None, models: dict | None = None) -> str | None:
    """The runtime's pre-launch verdict in this process (no process group): its one-line
    error, or None. ``make_case(model, plan, micro_batches, steps)`` builds the ``verify.Case``
    (default ``make_spec_case``); ``models`` keeps one built model per key across calls (the
    pre-launch rewrite probe remembers its verdicts per model)."""
    from autopar.models import load_model
    from autopar.runtime.assemble.prelaunch import check_before_launch
    from costmodels.contracts.errors import AutoparError
    from costmodels.contracts.plan import Plan
    try:
        plan = Plan.from_dict(case.plan_dict)
        c = (make_case or make_spec_case)(case.model, plan, case.micro_batches, 1)
        inputs = c.example_inputs
        if inputs is None and c.spec is not None:
            inputs = load_model(c.spec, seq=c.seq).example_inputs(plan.micro_batch_size, "cpu")
        models = {} if models is None else models
        model = models[case.model] = models.get(case.model) or c.build()
        check_before_launch(model, plan, num_micro_batches=case.micro_batches, spec=c.spec,
                            seq=c.seq, example_inputs=inputs, leaf_modules=c.leaf_modules,
                            allow_batch_statistics=c.allow_batch_statistics)
    except AutoparError as e:
        return f"{type(e).__name__}: {e}"
    return None


@dataclass
class SweepResult:
    results: dict = field(default_factory=dict)   # name -> {"status": ..., ...}
    seconds: float = 0.0
    worlds: int = 0                               # worlds started (one more per broken world)
    then: object = None                           # rank 0's result of run(then=...), if it ran


def run(cases: list[SweepCase], world: int = 8, steps: int = 3, make_case=None, then=None,
        then_args: tuple = ()) -> SweepResult:
    """Refuse before launch what the runtime refuses, run the rest in one world of ``world``
    processes; every case gets a status: pass, mismatch, refused (with its line) or error.
    ``then(*then_args)`` (picklable), if given, runs on every rank of the last world after the
    cases — another scenario sharing the world's start-up — and rank 0's result is ``.then``.

    A case that fails on some rank leaves the world's groups in an unknown state, so its rank
    records the error and ends the world; the remaining cases run in a fresh world."""
    import json
    import tempfile

    from autopar.runtime.verify.serial import spawn
    t0 = time.monotonic()
    out = SweepResult()
    todo, models = [], {}
    for c in cases:
        line = refusal(c, make_case, models)
        if line is not None:
            out.results[c.name] = {"status": "refused", "line": line}
        else:
            todo.append((c.name, c.model, c.plan_dict, c.micro_batches))
    os.environ.setdefault("AUTOPAR_COLLECTIVE_TIMEOUT", "120")
    while todo:
        with tempfile.TemporaryDirectory() as log_dir:
            out.worlds += 1
            *ranks, failure = spawn(world_loop, world, todo, make_case or make_spec_case, steps,
                                    log_dir, then, then_args, partial=True)
            out.then = ranks[0] if failure is None else out.then
            done = {}
            path = os.path.join(log_dir, "results.jsonl")
            if os.path.exists(path):
                with open(path) as f:
                    done = dict(json.loads(line) for line in f)
            first = sorted((os.path.getmtime(os.path.join(log_dir, n)), n)  # the first failure
                           for n in os.listdir(log_dir) if n.startswith("error-"))
            errors = [open(os.path.join(log_dir, n)).read() for _, n in first]
        for name, res in done.items():
            out.results[name] = classify(res)
        todo = [t for t in todo if t[0] not in done]
        if todo and (failure is not None or errors):
            name, _, line = (errors[0] if errors else f"{todo[0][0]}\t\t").partition("\t")
            line = line.strip() or f"the world ended: {str(failure).splitlines()[0] if failure else '?'}"
            out.results[name] = {"status": "error", "line": line.splitlines()[0]}
            todo = [t for t in todo if t[0] != name]
    out.seconds = time.monotonic() - t0
    return out


def classify(res: dict) -> dict:
    """A world result as pass or mismatch (with the figures)."""
    ok = res["keys_equal"] and res["rel"] <= RTOL and res["param_rel"] <= PARAM_RTOL
    return {"status": "pass" if ok else "mismatch", **res}


def param_difference(par: torch.Tensor, ser: torch.Tensor) -> float:
    """Largest difference of a parameter, relative to its largest value but at least
    ``PARAM_FLOOR``: a tensor whose gradient is zero in exact arithmetic (attention's key bias:
    softmax ignores a constant per row) only moves by rounding noise, which no relative
    measure of a near-zero tensor can compare."""
    if par.shape != ser.shape:
        return float("inf")
    return float((par.float() - ser.float()).abs().max() / ser.float().abs().max().clamp_min(PARAM_FLOOR))


def make_spec_case(model: str, plan, micro_batches: int, steps: int):
    """A ``verify.Case`` for a MODELS key: global batch dp·micro_batch_size·micro_batches."""
    from autopar.models import load_model
    from autopar.runtime.verify.serial import Case, no_dropout
    spec = CASE_MODELS[model]
    source = load_model(spec)
    gb = plan.dp * plan.micro_batch_size * micro_batches
    return Case(model, plan, lambda: no_dropout(source.build("cpu", seed=0)),
                lambda step: source.make_batch(gb, seed=100 + step), source.loss, steps=steps,
                spec=spec)


def world_loop(entries, make_case, steps: int, log_dir: str, then=None, then_args: tuple = ()):
    """Runs in every process of the world: each entry ``(name, model, plan dict, micro-batches)``
    on ranks 0 … dp·cp·tp·pp−1 (groups created by all ranks, members or not), compared with the
    serial model on rank 0, whose results go to ``log_dir/results.jsonl`` case by case. A rank
    whose case fails writes ``log_dir/error-<rank>`` and ends the process (so the world).
    Returns ``then(*then_args)`` after the last case (None without ``then``)."""
    import datetime
    import json

    import torch.distributed as dist

    from autopar.runtime.faults import dist as adist
    from autopar.runtime.verify.serial import compare, parallel_losses, serial_losses
    from costmodels.contracts.plan import Plan
    timeout = float(os.environ.get("AUTOPAR_COLLECTIVE_TIMEOUT", "300"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    t0 = time.monotonic()
    for name, model, plan_dict, micro_batches in entries:
        res = None
        try:
            plan = Plan.from_dict(plan_dict)
            adist.create_groups(plan, range(plan.world_size))  # all ranks, members or not
            if rank < plan.world_size:
                case = make_case(model, plan, micro_batches, steps)
                par, state = parallel_losses(case, group=adist.group(range(plan.world_size)),
                                             return_state=True)
                if rank == 0:
                    ser, ser_state = serial_losses(case, return_state=True)
                    diff = max((param_difference(state[k], v) for k, v in ser_state.items()),
                               default=0.0)
                    res = dict(par=par, ser=ser, rel=compare(par, ser), param_rel=diff,
                               keys_equal=sorted(state) == sorted(ser_state))
        except Exception as e:  # noqa: BLE001 — recorded, then this world ends
            root = e
            while root.__cause__ is not None or root.__context__ is not None:
                root = root.__cause__ or root.__context__
            line = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            if root is not e:
                line += " — caused by " + " ".join(f"{type(root).__name__}: {root}".split())[:300]
            with open(os.path.join(log_dir, f"error-{rank}"), "w") as f:
                f.write(f"{name}\t{line}\n")
            os._exit(3)
        if rank == 0:
            with open(os.path.join(log_dir, "results.jsonl"), "a") as f:
                f.write(json.dumps([name, res]) + "\n")
            if os.environ.get("AUTOPAR_TEST_PROGRESS"):
                print(f"[{time.monotonic() - t0:6.1f}s] {name}: {res}", flush=True)
        dist.barrier()
    return then(*then_args) if then is not None else None
