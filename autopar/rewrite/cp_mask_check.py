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

A third way: a float mask that shows the right keys but adds a position-dependent bias to the
scores (ALiBi, a T5 / relative-position bias, folded into the causal mask or added beside it,
or SDPA's float ``attn_mask``). The cp op applies no bias, so every additive or float mask —
read from a buffer too, where the slopes of an ALiBi usually live — is handed to it, and it
counts the query rows whose seen keys get different values (``biased_rows``; a bias constant
along a row changes nothing under softmax and passes). The op cannot take the bias instead:
the model computes it for the local queries against the *local* keys only, and the block
against the other ranks' keys exists nowhere in the rewritten graph.
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
    """Where a query sees a key, as a bool ``(..., t, t)``; None unless ``mask`` is a mask over
    the ``t`` local tokens (``(..., t, t)``, or ``(..., 1, t)``: the same for every query).
    ``kind``: "attend" (SDPA: True / 0 = seen), "fill" (``masked_fill``: True = hidden) or
    "additive" (``scores + mask``: ≤ -1e4 = hidden)."""
    if mask.dim() < 2 or mask.size(-1) != t or mask.size(-2) not in (1, t):
        return None
    mask = torch.broadcast_to(mask, (*mask.shape[:-2], t, t))
    if kind == "fill":
        return ~mask.bool()
    if mask.dtype == torch.bool:
        return mask
    return mask > -1e4


def biased_rows(mask: torch.Tensor, kind: str, t: int) -> int:
    """How many query rows of a float ``mask`` over the ``t`` local keys add different values to
    the scores of the keys they see (a position bias: ALiBi, relative, T5); 0 for a bool mask, a
    ``masked_fill`` one, a causal 0 / -inf one and a bias constant along each row (softmax drops it)."""
    if kind == "fill" or not mask.is_floating_point() or mask.dim() < 1 or mask.size(-1) != t:
        return 0
    m = mask.detach().float()
    seen = m > -1e4
    hi = torch.where(seen, m, float("-inf")).amax(-1)
    lo = torch.where(seen, m, float("inf")).amin(-1)
    return int(((hi > lo) & seen.any(-1)).sum())


def mask_counts(mask: torch.Tensor, kind: str, pos: torch.Tensor, whole: bool) -> tuple[int, int, int]:
    """(entries hiding a token from itself, query-key pairs that differ from the causal mask of
    the local tokens' global positions ``pos``, ``cp_attention.load_balanced_positions``, query
    rows given a position bias, ``biased_rows``); the second only when ``whole`` (a mask the
    graph builds itself)."""
    return terms_counts([(mask, kind, whole)], pos)


def terms_counts(terms, pos: torch.Tensor) -> tuple[int, int, int]:
    """``mask_counts`` of the masks ``terms`` (``(mask, kind, whole)`` each) one attention applies
    together (a causal ``masked_fill`` and an ALiBi added beside it): hidden and biased summed over
    the terms; the pairs that differ from causal compared on the keys all of them show, and only
    when every term is ``whole``."""
    t = int(pos.numel())
    hidden = sum(hidden_diagonal(m, k, t) for m, k, _ in terms)
    biased = sum(biased_rows(m, k, t) for m, k, _ in terms)
    seen = None
    for m, k, whole in terms:
        v = visible(m, k, t) if whole else None
        if v is None:
            return hidden, 0, biased
        seen = v if seen is None else seen & v
    pos = pos.to(seen.device)
    causal = pos[None, :] <= pos[:, None]
    return hidden, int((seen != causal).sum()), biased


def refuse_masks(mask: torch.Tensor, kind: str, pos: torch.Tensor, group, cp: int, where: str,
                 whole: bool) -> None:
    """``refuse_terms`` of one mask."""
    refuse_terms([(mask, kind, whole)], pos, group, cp, where)


def refuse_terms(terms, pos: torch.Tensor, group, cp: int, where: str) -> None:
    """Raise, on every rank of the cp group alike, the one-line PlanError for a step whose masks
    ``terms`` (``terms_counts``) the cp attention cannot apply (module docstring); ``pos``: the
    local tokens' global positions."""
    n = torch.tensor(terms_counts(terms, pos), dtype=torch.int64, device=terms[0][0].device)
    dist.all_reduce(n, group=group)
    hidden, differ, biased = (int(x) for x in n.tolist())
    if hidden:
        raise PlanError(f"context parallel (cp={cp}): the attention of '{where}' reads a mask that hides "
                        f"{hidden} token(s) from themselves — a padding mask, which the cp attention "
                        "(causal by global position) cannot apply; pack the samples without padding or "
                        "use cp=1")
    if biased:
        raise PlanError(f"context parallel (cp={cp}): the attention of '{where}' adds a position-dependent "
                        f"bias to its scores ({biased} query row(s) give their keys different values: ALiBi, "
                        "a relative or T5 position bias), which the cp attention (causal by global "
                        "position, no bias) cannot apply; use cp=1 for this model")
    if differ:
        raise PlanError(f"context parallel (cp={cp}): the attention of '{where}' applies a mask built in "
                        f"the model that is not causal ({differ} query-key pair(s) differ from the causal "
                        "mask: a sliding window, a bidirectional or a prefix mask), which the cp attention "
                        "(causal by global position) cannot apply; use cp=1 for this model")
