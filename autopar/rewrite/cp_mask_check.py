"""The mask a model's attention applies, checked against what the cp attention applies instead.

Under ``cp`` every attention becomes ``ContextParallelAttention``: the local queries against every
key of the sequence, causal by *global* position (``cp_attention``). The model's own mask is not
applied. That is exact only when the mask is the causal one. Two ways a mask can differ:

* it hides a token from itself: a padding mask (``hidden_diagonal``), refused since the last stop;
* it is not causal but hides no token from itself: a sliding window (hides keys further back than
  the window), a bidirectional or prefix-LM mask (shows later keys). Before this module such a
  mask built inside the model's graph (from ``torch.arange`` positions, ``torch.ones(...).tril()``
  of a window) ran silently as causal.

The rewrite hands every mask the graph builds itself (one that reads no buffer, the positions
in it already the local tokens' global ones, ``context_parallel._positions``) to the cp op, which
compares it on each step, on its ``T × T`` local block, with the causal mask of the tokens'
global positions (``load_balanced_positions``). Rank 0 holds the first and the last chunk, so
its block spans distances up to ``S − 1``: any window shorter than the sequence hides a pair there,
and any mask that shows a later key shows one on some rank. The counts of all ranks are summed
(one all-reduce), so every rank refuses the same step in the same line, naming the module.

A mask read from a buffer (GPT's ``bias[:, :, :T, :T]``) is checked once, statically, at rewrite
time (``context_parallel._check_causal_buffer``); its sliced columns are not global positions,
so it is not compared here.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from costmodels.contracts.errors import PlanError


def hidden_diagonal(mask: torch.Tensor, kind: str, t: int) -> int:
    """How many (sample, head, token) entries of the model's own attention mask hide a local
    token from itself. Under cp the op applies causality by global position and not the
    model's mask; a causal mask (whatever positions the model built it from) always lets a token
    see itself, so a hidden diagonal entry is a padding (or other non-causal) mask the op would
    silently drop. ``kind``: "attend" (SDPA: True / 0 = seen), "fill" (``masked_fill``: True =
    hidden) or "additive" (``scores + mask``: ≤ -1e4 = hidden)."""
    if mask.dim() < 2 or mask.size(-1) != t or mask.size(-2) not in (1, t):
        return 0
    d = torch.broadcast_to(mask, (*mask.shape[:-2], t, t)).diagonal(dim1=-2, dim2=-1)
    if kind == "fill":
        hidden = d.bool()
    elif d.dtype == torch.bool:
        hidden = ~d
    else:
        hidden = d <= -1e4
    return int(hidden.sum())


def visible(mask: torch.Tensor, kind: str, t: int) -> torch.Tensor | None:
    """Where a query sees a key, as a bool ``(..., t, t)``; None unless ``mask`` is a full mask
    over the ``t`` local tokens. ``kind``: "attend" (SDPA: True / 0 = seen), "fill"
    (``masked_fill``: True = hidden) or "additive" (``scores + mask``: ≤ -1e4 = hidden)."""
    if mask.dim() < 2 or mask.size(-1) != t or mask.size(-2) != t:
        return None
    if kind == "fill":
        return ~mask.bool()
    if mask.dtype == torch.bool:
        return mask
    return mask > -1e4


def mask_counts(mask: torch.Tensor, kind: str, pos: torch.Tensor, whole: bool) -> tuple[int, int]:
    """(entries hiding a token from itself, query-key pairs that differ from the causal mask of
    the local tokens' global positions ``pos``, ``cp_attention.load_balanced_positions``); the
    second only when ``whole`` (a mask the graph builds itself)."""
    t = int(pos.numel())
    hidden = hidden_diagonal(mask, kind, t)
    if not whole:
        return hidden, 0
    seen = visible(mask, kind, t)
    if seen is None:
        return hidden, 0
    pos = pos.to(mask.device)
    causal = pos[None, :] <= pos[:, None]
    return hidden, int((seen != causal).sum())


def refuse_masks(mask: torch.Tensor, kind: str, pos: torch.Tensor, group, cp: int, where: str,
                 whole: bool) -> None:
    """Raise, on every rank of the cp group alike, the one-line PlanError for a step whose mask
    the cp attention cannot apply (module docstring); ``pos``: the local tokens' global positions."""
    n = torch.tensor(mask_counts(mask, kind, pos, whole), dtype=torch.int64, device=mask.device)
    dist.all_reduce(n, group=group)
    hidden, differ = (int(x) for x in n.tolist())
    if hidden:
        raise PlanError(f"context parallel (cp={cp}): the attention of '{where}' reads a mask that hides "
                        f"{hidden} token(s) from themselves — a padding mask, which the cp attention "
                        "(causal by global position) cannot apply; pack the samples without padding or "
                        "use cp=1")
    if differ:
        raise PlanError(f"context parallel (cp={cp}): the attention of '{where}' applies a mask built in "
                        f"the model that is not causal ({differ} query-key pair(s) differ from the causal "
                        "mask: a sliding window, a bidirectional or a prefix mask), which the cp attention "
                        "(causal by global position) cannot apply; use cp=1 for this model")
