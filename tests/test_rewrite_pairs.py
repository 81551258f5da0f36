"""A tensor-parallel pair the trace (cost model) counts but the rewrite cannot shard is refused in
one line, not run replicated at the cost of a sharded one."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.rewrite import rewrite_row
from costmodels.contracts.errors import PlanError

D, FF = 16, 64


class Conv1D(nn.Module):
    """As transformers' GPT-2 Conv1D, y = x @ W + b with W of shape (in, out), on a 2-d input
    (fx traces into it, so the rewrite sees ``torch.addmm`` on parameters)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x, self.weight)


class _MLPBlock(nn.Module):
    def __init__(self, up: str):
        super().__init__()
        self.up_kind = up
        if up == "F.linear":
            self.w_up = nn.Parameter(torch.randn(FF, D) * 0.02)
        elif up == "Conv1D":
            self.up = Conv1D(FF, D)
        else:
            self.up = nn.Linear(D, FF)
        self.down = nn.Linear(FF, D)

    def forward(self, x):
        h = F.linear(x, self.w_up) if self.up_kind == "F.linear" else self.up(x)
        return x + self.down(F.gelu(h))


@pytest.mark.parametrize("up,named", [("F.linear", "F.linear"), ("Conv1D", "torch.addmm")])
def test_unshardable_linear_in_a_pair_is_refused(up, named):
    x = torch.randn(8, D)
    with pytest.raises(PlanError, match=rf"tp'=2.*{named}.*nn\.Linear"):
        rewrite_row(_MLPBlock(up), kind="block", tp_rank=0, tp_size=2, tp_group=None,
                    sequence_parallel=False, recompute="none", example_input=x)
    # tp=1 needs no sharding and runs
    gm = rewrite_row(_MLPBlock(up), kind="block", tp_rank=0, tp_size=1, tp_group=None,
                     sequence_parallel=False, recompute="none", example_input=x)
    assert gm(x).shape == x.shape


def test_nn_linear_pair_still_shards():
    x = torch.randn(2, 4, D)
    gm = rewrite_row(_MLPBlock("nn.Linear"), kind="block", tp_rank=0, tp_size=2, tp_group=None,
                     sequence_parallel=False, recompute="none", example_input=x)
    assert gm.autopar_info["pairs"] == {"down": {"columns": ["up"], "kind": "mlp",
                                                 "segments": {"up": [FF]}}}
