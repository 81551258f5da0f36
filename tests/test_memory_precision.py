"""Peak-memory measurement on CPU (validate's profiler-based live bytes) and the memory model's
``precision`` recipes: the measurement sees known allocations (also those of backward and of gloo
collectives), and the "amp" model matches what autopar's runtime really holds."""
import gc

import pytest
import torch

from autopar.validate.live_bytes import LiveBytes, live_peak
from autopar.validate.rank import _state_bytes
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.model.memory import activation_bytes, model_state_bytes
from costmodels.model.table_arrays import activation_bytes_none, table_arrays
from tests.synthetic_tables import gpt_table

MiB = 1 << 20



@pytest.fixture(autouse=True)
def _no_process_group_left():
    """autopar.apply on one process joins a 1-rank gloo group; leave none behind for the tests
    that check what happens without torchrun."""
    yield
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()

def _floats(nbytes):
    return torch.ones(nbytes // 4)


# ---- the measurement ---------------------------------------------------------------------
def test_live_bytes_follows_a_known_allocation_pattern():
    before = _floats(16 * MiB)          # allocated before the window: neither it nor its free counts
    with LiveBytes() as lb:
        a = _floats(4 * MiB)
        with lb.step():
            b = _floats(8 * MiB)        # 12
            del a                       # 8
            c = _floats(12 * MiB)       # 20 <- peak
            del before                  # not counted
            del b, c                    # 0
    peak, at_start = lb.result()
    assert at_start == 4 * MiB
    assert peak == 20 * MiB


def test_live_bytes_sees_what_backward_allocates():
    n = 1024
    w = torch.randn(n, n, requires_grad=True)
    x = torch.randn(64, n)
    with LiveBytes() as lb:
        with lb.step():
            (x @ w).relu().sum().backward()   # w.grad (4 MiB) is made by the autograd engine
    peak, at_start = lb.result()
    assert at_start == 0
    assert peak >= n * n * 4
    assert w.grad is not None


def test_a_second_window_ignores_frees_of_the_first_windows_blocks():
    with LiveBytes() as lb:
        old = _floats(8 * MiB)
        with lb.step():
            pass
    with LiveBytes() as lb2:
        new = _floats(2 * MiB)
        del old                          # allocated in the earlier window: must not count as −8
        gc.collect()
        with lb2.step():
            t = _floats(MiB)
            del t
    peak, at_start = lb2.result()
    assert at_start == 2 * MiB and peak == 3 * MiB
    del new


def test_live_peak_on_events():
    ev = [(1, 0xA, -100), (2, 0xB, 50), (3, 0xC, 30), (4, 0xB, -50), (5, 0xD, 10), (9, 0xE, 99)]
    assert live_peak(ev, 3, 5) == (80, 50)     # the free of 0xA (unknown block) is ignored
    assert live_peak([], 0, 1) == (0, 0)
    # 0xB is allocated again without a reported free (freed on an unwatched thread): it counts
    # only at its own allocation, not from there on
    ghost = [(1, 0xB, 40), (2, 0xC, 30), (3, 0xB, 10), (4, 0xC, -30)]
    assert live_peak(ghost, 0, 9) == (40, 0)        # 40 at t=1 alone; then 30, 30 + 10, 10
    assert live_peak(ghost, 3, 9) == (40, 30)


def _gloo_rank():
    import torch.distributed as dist

    from autopar.runtime.faults import dist as adist
    adist.ensure_initialized(2)
    x = _floats(4 * MiB)
    with LiveBytes() as lb:
        with lb.step():
            parts = [torch.empty_like(x) for _ in range(2)]   # 8 MiB, ours
            dist.all_gather(parts, x)                        # gloo flattens them: 8 MiB more
            del parts
    out = lb.result()
    dist.barrier()
    return out


@pytest.mark.slow
def test_live_bytes_sees_gloo_collective_temporaries():
    from autopar.runtime.verify.serial import spawn
    for peak, at_start in spawn(_gloo_rank, 2):
        assert at_start == 0
        assert peak >= 16 * MiB      # the output list and gloo's flat copy of it


# ---- model states: the "amp" recipe is what the runtime's tensors hold ---------------------
def test_amp_model_states_are_what_the_runtime_holds():
    from autopar.models import load_model
    from autopar.runtime.apply import apply
    spec = "gpt:layers=2,hidden=64,heads=2,vocab=512,seq=32"
    src = load_model(spec)
    runner = apply(src.build("cpu", seed=0), Plan(), loss_fn=src.loss, spec=spec)
    opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)
    x, y = src.make_batch(2, seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        runner.train_step(x, y)
    grads = _state_bytes(runner, opt)["grads"]
    opt.step()
    st = _state_bytes(runner, opt)
    psi = sum(p.numel() for p in runner.parameters())
    p, g, o = model_state_bytes(psi, 1, 0, "amp")
    assert st["params"] == p and grads == g
    assert st["optimizer"] == pytest.approx(o, rel=1e-3)   # + AdamW's scalar step counters
    assert model_state_bytes(psi, 1, 0) == (2 * psi, 2 * psi, 12 * psi)   # default: ZeRO Table 1


def test_amp_prediction_matches_a_measured_single_process_step():
    """autopar's runtime on one process (no torchrun), micro-batches 1 and 2: the amp estimate
    (total minus reserve) against the profiler's peak live bytes."""
    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.scoring import estimate_plans
    spec = "gpt:layers=2,hidden=128,heads=2,vocab=4096,seq=128"
    src = load_model(spec)
    x, y = src.make_batch(4, seed=0)
    for plan in (Plan(micro_batch_size=4), Plan(micro_batch_size=2)):
        gc.collect()
        with LiveBytes() as lb:
            runner = apply(src.build("cpu", seed=0, attention=plan.attention), plan,
                           loss_fn=src.loss, spec=spec)
            opt = torch.optim.AdamW(runner.parameters(), lr=1e-4)
            gc.collect()
            for s in range(2):
                with lb.step() if s else torch.autograd.profiler.record_function("warm-up"):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        runner.train_step(x, y)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        measured, _ = lb.result()
        [pred] = estimate_plans(spec, "cpu-2core", 1, 4, plan, precision="amp")
        mem = pred["memory_bytes"]
        predicted = mem["total"] - mem["reserve"]
        assert predicted == pytest.approx(measured, rel=0.10), (plan, predicted / measured)
        del runner, opt


# ---- the precision recipes in the model ----------------------------------------------------
def test_precision_is_checked_and_defaults_to_bf16_mixed():
    t = gpt_table(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024)
    with pytest.raises(PlanError, match="precision"):
        estimate(t, "a100-80g-sxm", Plan(), 1, 8, precision="bf16")
    assert (estimate(t, "a100-80g-sxm", Plan(), 1, 8).memory_bytes
            == estimate(t, "a100-80g-sxm", Plan(), 1, 8, precision="bf16-mixed").memory_bytes)


def test_loss_and_autocast_terms_per_row():
    t = gpt_table(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024)   # traced at b0 = 1
    arr = table_arrays(t)
    head = [i for i, r in enumerate(t.rows) if r.kind == "head"][0]
    blocks = arr.is_block
    logits = 2 * t.seq * t.vocab                                              # micro-batch 2
    norm_in = 2 * arr.boundary[head - 1]                                      # residual stream, b=2
    plain = {tp: activation_bytes(arr, tp, False, 2, "none", "math") for tp in (1, 4)}
    for tp in (1, 4):
        amp = activation_bytes(arr, tp, False, 2, "none", "math", "amp")
        # bf16-mixed: Korthikanti's 4·s·b·v/t (Megatron's vocab-parallel fp32 logits)
        table_only = activation_bytes_none(arr, tp, False, 2, "math")
        assert plain[tp][head] - table_only[head] == pytest.approx(4 * logits / tp)
        assert plain[tp][~blocks].sum() - table_only[~blocks].sum() == pytest.approx(4 * logits / tp)
        # amp: autopar gathers the logits, so 4·s·b·v on every rank, and the final norm's fp32 input
        assert amp[head] - plain[tp][head] == pytest.approx(4 * logits - 4 * logits / tp + norm_in)
        # amp: a pre-norm block's two norms save the fp32 residual stream (+2 bytes each)
        assert (amp - plain[tp])[blocks] == pytest.approx(2 * 2 * arr.boundary[blocks])
    fp32 = activation_bytes(arr, 1, False, 2, "none", "math", "fp32")
    assert fp32[blocks] == pytest.approx(2 * plain[1][blocks])


def test_amp_and_fp32_hold_more_than_bf16_mixed():
    t = gpt_table(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024)
    m = {p: estimate(t, "a100-80g-sxm", Plan(dp=2, zero=1), 2, 8, precision=p).memory_bytes
         for p in ("bf16-mixed", "amp", "fp32")}
    assert m["bf16-mixed"]["total"] < m["amp"]["total"]
    assert m["amp"]["activations"] < m["fp32"]["activations"]
    assert m["amp"]["total"] == pytest.approx(sum(v for k, v in m["amp"].items() if k != "total"))
