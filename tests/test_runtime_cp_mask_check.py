"""A mask built inside the model's graph, under context parallelism (issue 26): one that is not
causal but hides no token from itself (a sliding window, a prefix / bidirectional mask) is refused
in one line naming the module; a causal one built the same way runs. Without processes: the
block is rewritten for each cp rank with a FakeGroup, the mask each rank's cp op receives is
captured from a forward, and the counts the op all-reduces (``cp_mask_check.mask_counts``) are
summed over the ranks as the all-reduce would."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from costmodels.contracts.errors import PlanError

CP, T_SERIAL, D, H = 2, 16, 16, 2


class MaskedBlock(nn.Module):
    """Attention whose mask the block computes from the token positions: causal, causal within
    ``window`` keys, or causal plus a bidirectional prefix of ``prefix`` tokens; ``sdpa`` picks
    F.scaled_dot_product_attention (a bool mask, True = seen) or a written-out core
    (``masked_fill`` of the hidden pairs)."""

    def __init__(self, window: int = 0, prefix: int = 0, sdpa: bool = True):
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.window, self.prefix, self.sdpa = window, prefix, sdpa

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        pos = torch.arange(T, device=x.device)
        seen = pos[None, :] <= pos[:, None]
        if self.window:
            seen = seen & (pos[:, None] - pos[None, :] < self.window)
        if self.prefix:
            seen = seen | ((pos[None, :] < self.prefix) & (pos[:, None] < self.prefix))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=seen)
        else:
            att = (q @ k.transpose(-2, -1)) / (D // H) ** 0.5
            y = torch.softmax(att.masked_fill(~seen, float("-inf")), dim=-1) @ v
        return x + self.proj(y.transpose(1, 2).reshape(B, T, D))


def _rank_counts(block: nn.Module, rank: int) -> tuple[tuple[int, int], object]:
    """(the counts cp rank ``rank``'s op would all-reduce, the op) for one forward of the rewritten
    block on that rank's tokens."""
    from autopar.rewrite import FakeGroup, rewrite_row
    from autopar.rewrite.cp_attention import ContextParallelAttention
    from autopar.rewrite.cp_mask_check import mask_counts
    t = T_SERIAL // CP
    x = torch.randn(1, t, D, generator=torch.Generator().manual_seed(rank))
    gm = rewrite_row(block, kind="block", tp_rank=0, tp_size=1, tp_group=None, sequence_parallel=False,
                     recompute="none", example_input=x,
                     context_parallel=dict(cp=CP, rank=rank, group=FakeGroup(rank, CP), name="blocks.3"))
    [op] = [m for m in gm.modules() if isinstance(m, ContextParallelAttention)]
    got = {}
    op.register_forward_pre_hook(lambda m, args: got.update(mask=args[4] if len(args) > 4 else None))
    gm(x)
    assert got["mask"] is not None and op.mask_whole   # the graph's own mask reaches the op
    from autopar.rewrite.cp_attention import load_balanced_positions
    pos = load_balanced_positions(t, CP, rank)
    return mask_counts(got["mask"], op.mask_kind, pos, op.mask_whole), op


@pytest.mark.parametrize("kind, sdpa", [("causal", True), ("window", False), ("prefix", True)],
                         ids=["causal-sdpa", "window-written-out", "prefix-sdpa"])
def test_a_mask_built_in_the_graph_is_compared_with_causal_on_every_rank(kind, sdpa):
    torch.manual_seed(0)
    block = MaskedBlock(window=5 if kind == "window" else 0, prefix=3 if kind == "prefix" else 0, sdpa=sdpa)
    counts = [_rank_counts(block, r)[0] for r in range(CP)]
    hidden, differ = (sum(c[i] for c in counts) for i in (0, 1))
    assert hidden == 0   # none of the three hides a token from itself (the padding check passes it)
    if kind == "causal":
        assert differ == 0
    else:
        # window 5 over 16 tokens: rank 0 holds tokens 0-3 and 12-15, so 12-15 lose keys 0-3 (16 pairs)
        # and rank 1 (4-11) loses 4·3 + 3·2 + ... pairs; prefix 3: 3 future pairs among tokens 0-2
        assert differ == (16 + 6 if kind == "window" else 3)


def test_the_step_is_refused_in_one_line_naming_the_module(monkeypatch):
    """``refuse_masks`` (what the op calls each step) raises the one-line PlanError on the sum the
    all-reduce returns (here: this rank's counts, the all-reduce stubbed to a one-rank group)."""
    import autopar.rewrite.cp_mask_check as check
    from autopar.rewrite.cp_attention import load_balanced_positions
    _, op = _rank_counts(MaskedBlock(window=5), 0)
    t = T_SERIAL // CP
    pos = load_balanced_positions(t, CP, 0)
    assert pos.tolist() == [0, 1, 2, 3, 12, 13, 14, 15]   # the first chunk and the last
    causal = pos[None, :] <= pos[:, None]
    monkeypatch.setattr(check.dist, "all_reduce", lambda tensor, group=None: None)
    with pytest.raises(PlanError) as e:
        check.refuse_masks(causal & (pos[:, None] - pos[None, :] < 5), op.mask_kind, pos, None, CP,
                           op.where, op.mask_whole)
    line = str(e.value)
    assert "\n" not in line and "'blocks.3'" in line and "16 query-key pair(s)" in line and "cp=1" in line
    check.refuse_masks(causal, op.mask_kind, pos, None, CP, op.where, op.mask_whole)   # runs
