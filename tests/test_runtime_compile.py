"""``apply(..., compile=True)`` (what ``autopar verify --compile`` and ``autopar train --compile``
run): each row torch.compile'd with inductor's CPU backend, equal to the eager serial model on
gloo for dp2, tp2, pp2 and dp2·ZeRO-3 — four plans in one world of 2 ranks (one start-up; the
inductor cache makes the later plans' compiles of the same block cheap).

Slow: inductor compiles C++ kernels for each row's forward and backward (tens of seconds on a
shared 2-core machine with a cold cache)."""
from __future__ import annotations

import shutil

import pytest
from world_prefetch import Job, result

from autopar.runtime.verify.serial import Case, compare, no_dropout, spawn

pytestmark = pytest.mark.slow

SPEC = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16,dropout=0"
PLANS = {"dp2": {"dp": 2}, "tp2": {"tp": 2}, "pp2": {"pp": 2},
         "dp2-zero3": {"dp": 2, "zero": 3}}
STEPS = 3


def _case(name, plan_dict):
    from autopar.models import load_model
    from costmodels.contracts.plan import Plan
    source = load_model(SPEC)
    plan = Plan.from_dict(plan_dict)
    batch = 4

    def build():
        return no_dropout(source.build("cpu", seed=0))

    def batches(step):
        return source.make_batch(batch, seed=step)

    return Case(name, plan, build, batches, source.loss, steps=STEPS, spec=SPEC, compile=True)


def _rank():
    import torch.distributed as dist

    from autopar.runtime.faults import dist as adist
    from autopar.runtime.verify.serial import parallel_losses, serial_losses
    adist.ensure_initialized(2)
    out = {}
    for name, plan in PLANS.items():
        case = _case(name, plan)
        par = parallel_losses(case)
        ser = serial_losses(case) if dist.get_rank() == 0 else None
        out[name] = (par, ser)
    return out


# the world runs ahead in the suite's prefetch helper (tests/world_prefetch.py), beside the
# single-process tests (nothing in it is timed); none without a C compiler (the test skips)
PREFETCH_WORLD = Job(spawn, (_rank, 2)) if shutil.which("cc") else None


@pytest.mark.skipif(shutil.which("cc") is None, reason="inductor's CPU backend needs a C compiler")
def test_compiled_rows_equal_serial_for_dp_tp_pp_zero3():
    results = result(__name__, PREFETCH_WORLD)
    for name in PLANS:
        par, ser = results[0][name]
        assert len(par) == STEPS and par[-1] != par[0], (name, par)   # it trained
        assert compare(par, ser) <= 1e-5, (name, par, ser)
        assert results[1][name][0] == par, name   # every rank reports the same global loss


def test_compile_refused_in_one_line_without_a_c_compiler(monkeypatch):
    from autopar.runtime.step import compile_rows
    from costmodels.contracts.errors import PlanError
    monkeypatch.setattr(compile_rows.shutil, "which", lambda name: None)
    with pytest.raises(PlanError, match="needs a C compiler"):
        compile_rows.check_compilable("cpu")
    compile_rows.check_compilable("cuda")   # inductor writes Triton there, no cc needed
