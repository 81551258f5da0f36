"""autopar.apply equals the serial model: 5 SGD steps, fp32, gloo on CPU.

One world of 8 processes is started once for the whole module; every case below runs inside it
on ranks 0 … dp·tp·pp-1 (its process groups are created by all 8 ranks, once per rank set, and
reused by later cases), while the other ranks wait at a barrier. Each case compares the losses of 5 SGD
steps, and the parameters gathered by ``runner.full_state_dict()`` after them, with the single-process
model on the same global batches (relative tolerance 1e-5). Cases that need the tensor-parallel /
recompute rewrite are skipped while ``autopar.rewrite.rewrite_row`` is not there.
"""
from __future__ import annotations

import os
import time

import pytest
import torch

pytestmark = pytest.mark.slow

WORLD = 8
RTOL = 1e-5
STEPS = 5
SPECS = {
    "gpt": "gpt:layers=3,hidden=32,heads=4,vocab=64,seq=8,tied=true,dropout=0",
    "llama": "llama:layers=3,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8",
}


# ---- a user's own nanoGPT-style model: the fixture file, without dropout --------------------------
def _fixture_gpt_class():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nanogpt.py")
    spec = importlib.util.spec_from_file_location("autopar_test_fixture_nanogpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GPT


def NanoGPT(**overrides):
    kw = dict(vocab=64, block_size=8, n_layer=3, n_embd=32, n_head=4, dropout=0.0)
    return _fixture_gpt_class()(**{**kw, **overrides})


# ---- the cases ------------------------------------------------------------------------------
def _cases():
    out = []
    for model in ("gpt", "llama", "nanogpt"):
        for dp in (1, 2):
            for tp in (1, 2):
                for pp in (1, 2):
                    out.append((model, dict(dp=dp, tp=tp, pp=pp)))
    extra = [
        dict(dp=2, zero=1), dict(dp=2, zero=2), dict(dp=2, zero=3),
        dict(dp=2, pp=2, zero=1), dict(dp=2, pp=2, zero=2), dict(dp=2, pp=2, zero=3),
        dict(pp=2, schedule="gpipe"), dict(pp=2, schedule="1f1b"),
        dict(pp=2, vpp=2, schedule="interleaved-1f1b"),
        dict(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero=1),
        dict(dp=2, pp=2, micro_batch_size=2, stages=[[0, 2], [2, 5]]),
        dict(dp=2, pp=2, placement="dp,tp,pp"), dict(dp=2, pp=2, placement="tp,pp,dp"),
        dict(recompute="selective"), dict(recompute="full"),
        dict(tp=2, recompute="selective"), dict(tp=2, pp=2, recompute="full"),
        dict(tp=2, sequence_parallel=True), dict(dp=2, tp=2, pp=2, sequence_parallel=True),
        dict(tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", sequence_parallel=True),
        dict(dp=2, tp=2, zero=3), dict(dp=2, tp=2, pp=2, zero=1, recompute="selective"),
    ]
    out += [("gpt", p) for p in extra]
    out += [("llama", dict(tp=2, sequence_parallel=True)), ("llama", dict(dp=2, pp=2, zero=2)),
            ("llama", dict(dp=2, pp=2, zero=1, stages=[[0, 1], [1, 5]])),  # 1 tensor < dp
            ("nanogpt", dict(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b")),
            ("nanogpt", dict(dp=2, zero=3)), ("nanogpt", dict(tp=2, sequence_parallel=True))]
    return out


CASES = _cases()
# plans that do not fit the model: (model, plan, words the one-line error must contain)
ERROR_CASES = [
    ("gpt", dict(tp=3), ["tp", "heads"]),
    ("gpt", dict(pp=2, stages=[[0, 2], [2, 4]]), ["stages", "5 rows"]),
]


def _case_id(c):
    model, p = c
    return model + "-" + "-".join(f"{k}{'' if v is True else v}" for k, v in p.items())


def _make_case(model_name, plan):
    from autopar.models import load_model
    from autopar.models.source import token_loss
    from autopar.runtime.verify import Case, no_dropout
    n_micro = 2 * plan.pp if plan.pp > 1 else 2
    gb = plan.dp * plan.micro_batch_size * n_micro
    if model_name == "nanogpt":
        def build():
            torch.manual_seed(0)
            return NanoGPT()

        def batches(step):
            g = torch.Generator().manual_seed(100 + step)
            return (torch.randint(0, 64, (gb, 8), generator=g),), torch.randint(0, 64, (gb, 8), generator=g)

        return Case(_case_id((model_name, {})), plan, build, batches, token_loss, steps=STEPS,
                    example_inputs=(torch.zeros(plan.micro_batch_size, 8, dtype=torch.long),))
    spec = SPECS[model_name]
    source = load_model(spec)
    return Case(model_name, plan, lambda: no_dropout(source.build("cpu", seed=0)),
                lambda step: source.make_batch(gb, seed=100 + step), source.loss, steps=STEPS,
                spec=spec)


def _world(cases):
    """Runs in each of the 8 processes: every case, on its first dp·tp·pp ranks."""
    import torch.distributed as dist

    from autopar.runtime import dist as adist
    from autopar.runtime.verify import compare, parallel_losses, serial_losses
    from costmodels.errors import PlanError
    from costmodels.plan import Plan
    timeout_s = float(os.environ.get("AUTOPAR_COLLECTIVE_TIMEOUT", "300"))
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    results, t0 = {}, time.monotonic()
    for cid, model_name, plan_dict in cases:
        res = None
        try:
            plan = Plan.from_dict(plan_dict)
            adist.create_groups(plan, range(plan.world_size))  # all 8 ranks, members or not
            if rank < plan.world_size:
                case = _make_case(model_name, plan)
                g = adist.group(range(plan.world_size))
                par, state = parallel_losses(case, group=g, return_state=True)
                if rank == 0:
                    ser, ser_state = serial_losses(case, return_state=True)
                    diff = max((float((state[k] - v).abs().max() / v.abs().max().clamp_min(1e-12))
                                for k, v in ser_state.items()), default=0.0)
                    res = dict(par=par, ser=ser, rel=compare(par, ser), param_rel=diff,
                               keys_equal=sorted(state) == sorted(ser_state))
        except PlanError as e:
            res = dict(skip=str(e)) if "autopar.rewrite" in str(e) else dict(error=f"PlanError: {e}")
        except Exception as e:  # noqa: BLE001 — reported by the test of this case
            res = dict(error=f"{type(e).__name__}: {e}")
        if rank == 0:
            results[cid] = res
            if os.environ.get("AUTOPAR_TEST_PROGRESS"):
                print(f"[{time.monotonic() - t0:6.1f}s] {cid}: {res}", flush=True)
        dist.barrier()
    return results if rank == 0 else None


@pytest.fixture(scope="module")
def world_results():
    from autopar.runtime.verify import spawn
    os.environ.setdefault("AUTOPAR_COLLECTIVE_TIMEOUT", "120")
    todo = [(_case_id(c), c[0], c[1]) for c in CASES]
    todo += [("error-" + _case_id(c[:2]), c[0], c[1]) for c in ERROR_CASES]
    return spawn(_world, WORLD, todo)[0]


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_parallel_equals_serial(world_results, case):
    res = world_results[_case_id(case)]
    if "skip" in res:
        pytest.skip(res["skip"])
    assert "error" not in res, res["error"]
    assert res["keys_equal"], "full_state_dict() keys differ from the serial model's state dict"
    assert res["rel"] <= RTOL, f"losses differ: parallel {res['par']} serial {res['ser']}"
    assert res["param_rel"] <= 1e-4, f"parameters after {STEPS} steps differ by {res['param_rel']:.3g}"


@pytest.mark.parametrize("case", ERROR_CASES, ids=[_case_id(c[:2]) for c in ERROR_CASES])
def test_plan_that_does_not_fit_names_the_field(world_results, case):
    res = world_results["error-" + _case_id(case[:2])]
    assert "error" in res and res["error"].startswith("PlanError"), res
    assert "\n" not in res["error"]
    for word in case[2]:
        assert word in res["error"], res["error"]
