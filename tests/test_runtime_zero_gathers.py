"""How often ZeRO-2/3 gather their weights per step on FSDP2 (2 gloo ranks): ZeRO-2 once per
step however many micro-batches (parameters kept gathered through gradient accumulation, what
the cost model's dp_sync prices), ZeRO-3 before every micro-batch's forward and backward."""
import pytest

pytestmark = pytest.mark.slow
SPEC = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8,dropout=0"


def _gathers_per_step():
    """{(zero, micro-batches): all-gathers one train_step issues} on this rank."""
    import torch.distributed as dist

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    adist.ensure_initialized(2)
    calls = []
    # FSDP2's flat all-gather (torch 2.13: all_gather_single; earlier: all_gather_into_tensor)
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    real = getattr(dist, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    setattr(dist, name, counted)
    src = load_model(SPEC)
    out = {}
    for zero in (2, 3):
        runner = apply(src.build("cpu", seed=0), Plan(dp=2, zero=zero, micro_batch_size=1),
                       loss_fn=src.loss, spec=SPEC)
        for n_micro in (1, 4):
            x, y = src.make_batch(2 * n_micro, seed=1)
            n = n_micro
            sl = slice(runner.dp_rank * n, (runner.dp_rank + 1) * n)
            runner.train_step(tuple(t[sl] for t in x), y[sl])   # the first gathers may differ
            calls.clear()
            runner.train_step(tuple(t[sl] for t in x), y[sl])
            out[(zero, n_micro)] = len(calls)
            for p in runner.parameters():
                p.grad = None
    setattr(dist, name, real)
    return out


def test_zero2_gathers_once_per_step_zero3_every_micro_batch():
    from autopar.runtime.verify.serial import spawn
    counts = spawn(_gathers_per_step, 2)[0]
    assert counts[(2, 1)] > 0
    assert counts[(2, 4)] == counts[(2, 1)]                 # not one per micro-batch
    assert counts[(3, 4)] == 4 * counts[(3, 1)]             # forward and backward, every one
    assert counts[(3, 1)] == 2 * counts[(2, 1)]
