"""autocast's weight cache makes every backward after the first hold all bf16 weight gradients
to its end (costmodels/model/autocast_grads.py), and the amp memory model charges them.

Single process, a 4-linear net: fast."""
from __future__ import annotations

import dataclasses

import pytest
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


def test_amp_end_of_backward_charges_the_cast_gradients_only_with_several_micro_batches():
    """dp4 ZeRO-1 (a quarter of the optimizer state and of its step temporary, so the end of
    backward is the step's peak at any m): m = 4 micro-batches hold 2 bytes more per cached
    weight than m = 1 under amp; fp32 (no autocast) does not move."""
    from synthetic_tables import llama_table

    from costmodels.contracts.plan import Plan
    from costmodels.model.estimate import estimate
    from costmodels.profiles.hardware_files import load_profile
    table = llama_table(8, 1024, 8, 8, 2816, 1024, 256)   # weights outweigh activations
    hw = dataclasses.replace(load_profile("h100-80g-sxm"), hbm_bytes=1e15)
    cached = sum(r.params for r in table.rows if r.kind in ("block", "head"))
    plan = Plan(dp=4, pp=1, micro_batch_size=1, zero=1, recompute="full")

    def total(m, precision):
        return estimate(table, hw, plan, 4, 4 * m, precision=precision).memory_bytes["total"]
    assert total(4, "amp") - total(1, "amp") == pytest.approx(2.0 * cached, rel=1e-3)
    assert total(4, "fp32") == pytest.approx(total(1, "fp32"), rel=1e-3)
