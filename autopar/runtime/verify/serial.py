"""Equivalence check: the parallel runner against the single-process model, same seed, same data.

``verify(spec, plan, steps, nproc)`` (what ``autopar verify`` runs) checks the plan against the
model and the batch without a process group (``autopar.runtime.assemble.prelaunch``: a plan that cannot
run fails in one line before any rank exists), spawns ``nproc`` local ranks
(gloo on CPU; NCCL when there is a GPU for every rank), builds the model from the same seed on
each, runs ``steps`` optimizer steps with ``autopar.apply`` and, on rank 0, the same steps with
the serial model on the whole global batch, and returns both loss curves.

``spawn(fn, nproc, *args)`` is the small launcher it uses (also used by the tests to start one
world and run many plans in it): it sets torchrun's environment variables for each process.
"""
from __future__ import annotations

import math
import os
import pickle
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class Case:
    """One comparison inside a running world (picklable when ``build`` is a module function)."""

    name: str
    plan: object                        # costmodels.contracts.plan.Plan
    build: Callable[[], nn.Module]      # builds the model from a fixed seed
    batches: Callable[[int], tuple]     # step -> (inputs tuple, targets) of the GLOBAL batch
    loss_fn: Callable
    steps: int = 5
    lr: float = 0.1
    optimizer: str = "sgd"
    spec: str | None = None
    example_inputs: tuple | None = None
    seq: int | None = None
    clip: float | None = None           # max gradient norm (serial: torch's; parallel: the runner's)
    table: object | None = None         # the layer table for the balanced split (traced with leaves)
    compile: bool = False               # the parallel side's rows torch.compile'd (apply's compile)
    leaf_modules: tuple = ()            # classes the row cutter keeps whole (``--leaf``)
    allow_batch_statistics: bool = False   # BatchNorm micro-batched (autopar.runtime.assemble.batch_statistics)


def make_optimizer(name: str, params, lr: float):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; use sgd or adamw")


def no_dropout(model: nn.Module) -> nn.Module:
    """Set every dropout probability to 0, for a deterministic comparison."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "dropout", None), float):
            m.dropout = 0.0
    return model


def serial_losses(case: Case, return_state: bool = False):
    """The single-process model: one optimizer step per global batch, its output read as the
    runtime's rows read it (``autopar.models.outputs``: the logits, targets passed to a model
    that takes them)."""
    from autopar.models.outputs import serial_forward
    model = case.build()
    opt = make_optimizer(case.optimizer, model.parameters(), case.lr)
    out = []
    for step in range(case.steps):
        inputs, targets = case.batches(step)
        loss = case.loss_fn(serial_forward(model, inputs, targets), targets)
        loss.backward()
        if case.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), case.clip)
        opt.step()
        opt.zero_grad()
        out.append(float(loss.detach()))
    if return_state:
        return out, {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out


def parallel_losses(case: Case, group=None, return_state: bool = False):
    """The same steps with ``autopar.apply``; each rank feeds its dp slice of the global batch.
    With ``return_state``: also ``runner.full_state_dict()`` (None except on the first rank)."""
    from autopar.runtime.apply import apply
    runner = apply(case.build(), case.plan, loss_fn=case.loss_fn, spec=case.spec, seq=case.seq,
                   group=group, example_inputs=case.example_inputs, table=case.table,
                   compile=case.compile,
                   leaf_modules=case.leaf_modules, allow_batch_statistics=case.allow_batch_statistics)
    opt = make_optimizer(case.optimizer, runner.parameters(), case.lr)
    out = []
    for step in range(case.steps):
        inputs, targets = case.batches(step)
        n = inputs[0].size(0) // runner.dp_size
        sl = slice(runner.dp_rank * n, (runner.dp_rank + 1) * n)
        loss = runner.train_step(tuple(t[sl] for t in inputs),
                                 targets[sl] if targets is not None else None)
        if case.clip is not None:
            runner.clip_grad_norm_(case.clip)
        opt.step()
        opt.zero_grad()
        out.append(loss)
    if return_state:
        return out, runner.full_state_dict()
    return out


def compare(par: list[float], ser: list[float]) -> float:
    """Largest relative difference between two loss curves; inf when a loss on either side is
    NaN or infinite (a diverged run must never pass a tolerance, and NaN compares false)."""
    if not all(math.isfinite(x) for x in (*par, *ser)):
        return math.inf
    return max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(par, ser)), default=0.0)


# ---- the launcher ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, nproc: int, port: int, out_dir: str, fn, args, env=None):
    from autopar.runtime.verify.rank_start import apply_environment
    apply_environment(env)   # the caller's environment, when the rank is a fork server's child
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      AUTOPAR_PHASE_DIR=out_dir)   # what each rank is doing, read if it dies
    torch.set_num_threads(1)
    result = fn(*args)
    path = os.path.join(out_dir, f"rank{rank}.pkl")
    with open(path + ".tmp", "wb") as f:   # complete or absent: spawn trusts a file that exists
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)
    import torch.distributed as dist
    if dist.is_initialized():
        try:   # every rank done with its collectives before gloo's threads are torn down
            dist.barrier()
        except Exception:  # noqa: BLE001
            pass
        dist.destroy_process_group()


def spawn(fn, nproc: int, *args, partial: bool = False) -> list:
    """Run ``fn(*args)`` in ``nproc`` fresh processes with torchrun's environment; return each
    rank's result (``fn`` and its result must pickle). With ``partial``, a failed run returns
    the results of the ranks that finished (None for the others) and the error as the last item."""
    import torch.multiprocessing as mp

    from autopar.runtime.verify import rank_start
    method = rank_start.start_method()   # spawn; the test suite's fork server (rank_start)
    with tempfile.TemporaryDirectory() as out_dir:
        error = None
        try:
            mp.start_processes(_entry, args=(nproc, free_port(), out_dir, fn, args,
                                             rank_start.rank_environment(method)),
                               nprocs=nproc, join=True, start_method=method)
        except Exception as e:  # noqa: BLE001
            # a rank that wrote its result and then died tearing down gloo (an abort in
            # destroy_process_group, seen about once in 7 runs on a loaded 2-core host) lost
            # nothing: only a rank without a result is a failure
            done = all(os.path.exists(os.path.join(out_dir, f"rank{r}.pkl")) for r in range(nproc))
            from autopar.runtime.faults.rank_exit import rank_died
            died = rank_died(e, out_dir, "its work")   # a killed rank: one line naming it
            if not done and not partial:
                if died is e:
                    raise
                raise died from None
            error = None if done else died
        results = []
        for r in range(nproc):
            path = os.path.join(out_dir, f"rank{r}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    results.append(pickle.load(f))
            else:
                results.append(None)
        return results + [error] if partial else results


# ---- autopar verify -------------------------------------------------------------------------
def _spec_case(spec: str, seq, plan, steps: int, global_batch: int, lr: float, optimizer: str,
               seed: int, table=None, compile: bool = False, leaf_modules=(),
               allow_batch_statistics=False) -> Case:
    from autopar.models import load_model
    source = load_model(spec, seq=seq)
    attention = getattr(plan, "attention", "math")

    def build():
        return no_dropout(source.build("cpu", seed=seed, attention=attention))

    def batches(step):
        return source.make_batch(global_batch, seed=seed * 1000 + step)

    return Case(name=spec, plan=plan, build=build, batches=batches, loss_fn=source.loss,
                steps=steps, lr=lr, optimizer=optimizer, spec=spec, seq=seq, table=table,
                compile=compile,
                leaf_modules=tuple(leaf_modules), allow_batch_statistics=allow_batch_statistics)


def _verify_rank(spec, seq, plan_dict, steps, global_batch, lr, optimizer, seed, table=None,
                 compile=False, leaf_modules=(), allow_batch_statistics=False):
    import torch.distributed as dist

    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.errors import AutoparError
    from costmodels.contracts.plan import Plan
    plan = Plan.from_dict(plan_dict)
    try:
        case = _spec_case(spec, seq, plan, steps, global_batch, lr, optimizer, seed, table, compile,
                          leaf_modules, allow_batch_statistics)
        adist.ensure_initialized(plan.world_size)
        ser = serial_losses(case) if dist.get_rank() == 0 else None
        par = parallel_losses(case)
    except AutoparError as e:  # the same on every rank (a plan that does not fit the model)
        return {"error": str(e), "type": type(e).__name__}
    return {"parallel": par, "serial": ser}


def verify(spec: str, plan, *, steps: int = 5, nproc: int | None = None, seq: int | None = None,
           global_batch: int | None = None, lr: float = 0.1, optimizer: str = "sgd",
           seed: int = 0, leaf_modules=(), compile: bool = False, allow_batch_statistics: bool = False
           ) -> tuple[list[float], list[float], int]:
    """Run the comparison; returns (parallel losses, serial losses, global batch).
    ``leaf_modules``: classes the layer table (the balanced split) is traced with as leaves.
    ``compile``: the parallel side's rows compiled (``apply(..., compile=True)``), the serial
    side eager — the check that compiling changes nothing but speed."""
    from costmodels.contracts.errors import PlanError
    if nproc is not None and nproc < 1:
        raise PlanError(f"--nproc {nproc} must be at least 1; pass --nproc {plan.world_size} "
                        "(dp·cp·tp·pp of the plan) or leave it out")
    nproc = nproc or plan.world_size
    if nproc != plan.world_size:
        raise PlanError(f"--nproc {nproc} != dp·cp·tp·pp = {plan.dp}·{plan.cp}·{plan.tp}·{plan.pp} = "
                        f"{plan.world_size} for this plan; pass --nproc {plan.world_size}")
    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # fewer GPUs than ranks: use gloo
    if global_batch is None:
        per_dp = plan.micro_batch_size * (2 * plan.pp if plan.pp > 1 else 2)
        global_batch = plan.dp * per_dp
    # every check of the plan against the model and the batch, before any rank is spawned
    m = plan.num_micro_batches(global_batch)
    from autopar.models import load_model
    from autopar.runtime.assemble.prelaunch import check_before_launch
    source = load_model(spec, seq=seq)
    table = None
    if leaf_modules:
        from autopar.trace import table_for
        table = table_for(spec, plan.micro_batch_size, seq, tuple(leaf_modules))
    check_before_launch(source.build("meta", seed=None, attention=plan.attention), plan,
                        num_micro_batches=m, spec=spec, seq=seq, table=table,
                        example_inputs=source.example_inputs(plan.micro_batch_size, "cpu"),
                        leaf_modules=tuple(leaf_modules), allow_batch_statistics=allow_batch_statistics)
    *results, failure = spawn(_verify_rank, nproc, spec, seq, plan.to_dict(), steps,
                              global_batch, lr, optimizer, seed, table, compile, tuple(leaf_modules),
                              allow_batch_statistics, partial=True)
    for r in results:  # a user error on any rank explains the others' failures
        if r is not None and "error" in r:
            import costmodels.contracts.errors as errors
            raise getattr(errors, r["type"], errors.AutoparError)(r["error"])
    if failure is not None:
        raise failure
    return results[0]["parallel"], results[0]["serial"], global_batch
