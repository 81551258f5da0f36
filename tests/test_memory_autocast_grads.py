"""autocast's weight cache makes every backward after the first hold all bf16 weight gradients
to its end, and FSDP2 then reduces before they are accumulated: why autopar's runtime casts anew
per micro-batch (autopar/runtime/step/schedules.py fresh_autocast_casts).

Single process, a 4-linear net: fast."""
from __future__ import annotations

import torch
from torch import nn


def _backward_order(cache_enabled: bool) -> list[list[str]]:
    """Per micro-batch (two, one autocast region): the order in which the activation-gradient
    hooks (``act``) and the weights' cast nodes (``cast``, ToCopyBackward0) run."""
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])
    x = torch.randn(4, 32, requires_grad=True)
    params = {id(p) for p in net.parameters()}
    logs: list[list[str]] = []
    hooked: set = set()   # a cached cast node is shared by the micro-batches: hook it once
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
        for _ in range(2):
            log: list[str] = []
            logs.append(log)
            h = x
            for lin in net:
                h = lin(h)
                h.register_hook(lambda g: logs[-1].append("act"))
            loss = h.float().sum()
            todo, seen = [loss.grad_fn], set()
            while todo:   # the cast nodes whose input is one of the net's parameters
                n = todo.pop()
                if n is None or n in seen:
                    continue
                seen.add(n)
                nxt = [c for c, _ in n.next_functions]
                if type(n).__name__ == "ToCopyBackward0" and n not in hooked and any(
                        getattr(c, "variable", None) is not None and id(c.variable) in params for c in nxt):
                    hooked.add(n)
                    n.register_prehook(lambda g: logs[-1].append("cast"))
                todo.extend(nxt)
            loss.backward()
    return logs


def test_a_later_micro_batch_runs_every_cached_cast_after_the_whole_activation_backward():
    first, second = _backward_order(cache_enabled=True)
    assert first.count("cast") == second.count("cast") == 8   # 4 weights + 4 biases
    # micro-batch 1: its casts are as new as its matmuls, each runs right after its matmul
    assert first.index("cast") < len(first) - 1 - first[::-1].index("act")
    # micro-batch 2: the cached casts are micro-batch 1's (older than every node of this
    # graph), so all of them wait until the activation backward is done: every bf16 weight
    # gradient is live at once
    assert second == ["act"] * 4 + ["cast"] * 8
    # without the cache each micro-batch casts anew, and a later one behaves as the first
    _, uncached = _backward_order(cache_enabled=False)
    assert uncached.index("cast") < len(uncached) - 1 - uncached[::-1].index("act")


def test_fsdp2_micro_batches_in_one_autocast_region_get_the_plain_models_gradients():
    """The consequence the runtime fixes (autopar/runtime/step/schedules.py fresh_autocast_casts):
    FSDP2 (ZeRO-2, gradients synced on the last micro-batch) over m = 2 micro-batches inside ONE
    autocast region. With micro-batch 1's cached casts, FSDP2's post-backward reduced before the
    casts had accumulated micro-batch 2's weight gradients (0.6 relative error measured); run_local
    casts anew per micro-batch and matches the plain model, which accumulates whatever the order."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from autopar.runtime.faults.dist import ensure_initialized
    from autopar.runtime.step.schedules import run_local
    ensure_initialized(1)
    torch.manual_seed(0)
    ref = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
    net = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (1,))
    for lin in net:
        fully_shard(lin, mesh=mesh, reshard_after_forward=False)
    fully_shard(net, mesh=mesh, reshard_after_forward=False)
    x = torch.randn(4, 16)
    loss_fn = lambda out, _t: out.float().pow(2).mean()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        run_local(net, (x,), None, 2, 2, loss_fn, keep_unsharded=True)
        for i in range(2):
            (loss_fn(ref(x[2 * i:2 * i + 2]), None) / 2).backward()
    for p, q in zip(net.parameters(), ref.parameters()):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        assert torch.allclose(g, q.grad, rtol=1e-2, atol=1e-4), (g - q.grad).abs().max()
