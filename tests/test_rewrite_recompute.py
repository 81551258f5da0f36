"""Selective recompute finds the attention core the trace (cost model) counts, in every spelling
the trace recognises (``nn.Softmax`` module, ``einsum``), and refuses loudly when it cannot wrap it."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.rewrite import gather_row_state_dict, rewrite_row
from autopar.rewrite.collectives import FakeGroup
from costmodels.contracts.errors import PlanError

D, H = 32, 4


class _Attn(nn.Module):
    """q/k/v projection + output projection around an attention core given by ``core``."""

    def __init__(self, style: str):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.softmax = nn.Softmax(dim=-1)
        self.style = style

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        if self.style == "module":
            att = self.softmax(q.__matmul__(k.transpose(-2, -1)) * (C // H) ** -0.5)
            y = att.__matmul__(v)
        elif self.style == "einsum":
            att = F.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) * (C // H) ** -0.5, dim=-1)
            y = torch.einsum("bhqk,bhkd->bhqd", att, v)
        else:  # "leaky": the probabilities are also used outside the core
            att = F.softmax(q @ k.transpose(-2, -1), dim=-1)
            y = att @ v + att.mean()
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class _Block(nn.Module):
    def __init__(self, style: str):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = _Attn(style)

    def forward(self, x):
        return x + self.attn(self.ln(x))


@pytest.mark.parametrize("style", ["module", "einsum"])
def test_selective_wraps_module_softmax_and_einsum_cores(style):
    torch.manual_seed(0)
    serial = _Block(style)
    local = copy.deepcopy(serial)
    x = torch.randn(2, 8, D)
    gm = rewrite_row(local, kind="block", tp_rank=0, tp_size=1, tp_group=None,
                     sequence_parallel=False, recompute="selective", example_input=x)
    assert hasattr(gm, "attention_core"), gm.code
    assert "checkpoint" in gm.code
    assert not any(n.op == "call_function" and n.target is F.softmax for n in gm.graph.nodes)
    assert not any(n.op == "call_module" and "softmax" in n.target for n in gm.graph.nodes)

    xs, xl = x.clone().requires_grad_(), x.clone().requires_grad_()
    ys, yl = serial(xs), gm(xl)
    torch.testing.assert_close(yl, ys)
    g = torch.randn(ys.shape, generator=torch.Generator().manual_seed(1))
    (ys * g).sum().backward()
    (yl * g).sum().backward()
    torch.testing.assert_close(xl.grad, xs.grad)
    grads = gather_row_state_dict(gm, FakeGroup(0, 1), grads=True)
    for name, p in serial.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=lambda m, name=name: f"{name}: {m}")


def test_selective_refuses_a_core_it_cannot_wrap():
    x = torch.randn(2, 8, D)
    with pytest.raises(PlanError, match="selective"):
        rewrite_row(_Block("leaky"), kind="block", tp_rank=0, tp_size=1, tp_group=None,
                    sequence_parallel=False, recompute="selective", example_input=x)
    # the same block is fine without selective recompute
    gm = rewrite_row(_Block("leaky"), kind="block", tp_rank=0, tp_size=1, tp_group=None,
                     sequence_parallel=False, recompute="none", example_input=x)
    assert gm(x).shape == x.shape
