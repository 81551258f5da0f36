"""Context-parallel attention over ``torch.distributed``: all-gather-KV with causal load balancing.

Under ``cp`` each sample's sequence of ``S`` tokens is cut into ``2·cp`` chunks of ``S / (2·cp)``;
cp rank ``i`` holds chunks ``i`` and ``2·cp − 1 − i`` (``load_balanced_positions``), so every rank
has the same share of the causal triangle (Megatron-core's and torch's ``context_parallel``
order). Every op but attention is per token and runs on the local ``S / cp`` tokens as it is;
attention needs every key:

* forward: K and V of the local tokens are all-gathered over the cp group (Megatron's
  ``cp_comm_type=all_gather``, torch's ``_AllGatherRotater``), the local queries attend to all
  ``S`` keys under the causal mask of their *global* positions (``pos_k <= pos_q``);
* backward (``GatherSeq``, a differentiable all-gather): each rank's gradient of the gathered K
  and V is summed over the cp group and each rank keeps its own tokens' part (reduce-scatter on
  NCCL; all-reduce and slice on gloo, which has no reduce-scatter).

Softmax over the keys does not depend on their order, so the result equals serial attention up
to rounding. The ring variant (p2p of K/V blocks overlapped with each block's attention) is what
the cost model may price for Megatron; this runtime runs the all-gather form, whose memory is
``S`` keys per rank instead of ``2·S/cp`` — fine at the lengths ``autopar verify`` runs.

On CUDA over NCCL, an attention the model wrote as ``F.scaled_dot_product_attention`` runs
torch's context-parallel attention instead (``autopar.rewrite.cp_torch_ring``: its ring kernels
over DTensors, as torchtitan wires it); it cannot run on CPU (no sharding strategy for
``aten._scaled_dot_product_flash_attention_for_cpu`` in torch 2.13), so that path has not been
verified here, and an attention written out (``softmax(q kᵀ) v``) keeps this op on CUDA too.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.rewrite.cp_mask_check import hidden_diagonal, refuse_terms  # noqa: F401  (hidden_diagonal re-exported)
from autopar.rewrite.cp_torch_ring import SHAPE_PROBE, TORCH_RING, kernel_for, torch_ring_attention

_arange = torch.arange   # the real one: ``global_positions`` patches torch.arange while a model is cut


def load_balanced_positions(t_local: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """Global positions of the ``t_local`` tokens cp rank ``rank`` holds: chunk ``rank`` then
    chunk ``2·cp − 1 − rank`` of the ``2·cp`` equal chunks of a sequence of ``t_local·cp``."""
    t_local = int(t_local)
    c = t_local // 2
    a = _arange(rank * c, (rank + 1) * c, device=device)
    b = _arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)
    return torch.cat([a, b])


def cp_positions(end, cp: int, rank: int, device=None, dtype=None) -> torch.Tensor:
    """What ``torch.arange(end)`` over the local tokens becomes under cp: their global
    positions (the rewrite's replacement of position ids)."""
    pos = load_balanced_positions(end, cp, rank, device=device)
    return pos.to(dtype) if dtype is not None else pos


def cp_select_rows(table: torch.Tensor, end, cp: int, rank: int) -> torch.Tensor:
    """What ``table[:end]`` of a position table (rotary cos / sin) becomes under cp: the rows of
    the local tokens' global positions."""
    return table.index_select(0, load_balanced_positions(end, cp, rank, device=table.device))


def sequence_slice(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's tokens of a full-sequence tensor (inputs, targets, masks), in the
    load-balanced order the rewritten rows expect."""
    S = t.size(dim)
    pos = load_balanced_positions(S // cp, cp, rank, device=t.device)
    return t.index_select(dim, pos)


class GatherSeq(torch.autograd.Function):
    """All-gather along ``dim`` over the cp group in forward; sum of the gradients over the
    group, each rank keeping its own slice, in backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        n = dist.get_world_size(group)
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        n = dist.get_world_size(ctx.group)
        if dist.get_backend(ctx.group) == "nccl":
            parts = [p.contiguous() for p in grad.chunk(n, ctx.dim)]
            out = torch.empty_like(parts[0])
            dist.reduce_scatter(out, parts, group=ctx.group)
            return out, None, None
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(n, ctx.dim)[ctx.rank].contiguous(), None, None


class ContextParallelAttention(nn.Module):
    """softmax(q kᵀ · scale [causal]) v for the local queries against every key of the
    sequence (module docstring). Parameter-free: a leaf of the rewritten graph, like the tensor
    parallel collectives. q, k, v: (B, H, T_local, D) with the same H (GQA heads repeated
    before, as the models do)."""

    def __init__(self, group, cp: int, rank: int, causal: bool, scale: float | None, sdpa: bool = False):
        super().__init__()
        self.group, self.cp, self.rank = group, cp, rank
        self.causal, self.scale = causal, scale
        self.sdpa = sdpa   # the model called F.scaled_dot_product_attention: CUDA runs torch's (cp_torch_ring)
        self.mask_kind, self.where = None, ""   # the model's own mask, checked each step (hidden_diagonal)
        self.mask_whole = False   # a mask the graph builds: also compared with causal (cp_mask_check)
        self.more_masks: list[tuple[str, bool]] = []   # (kind, whole) of further masks the core applies

    def extra_repr(self) -> str:
        return f"cp={self.cp}, rank={self.rank}, causal={self.causal}, scale={self.scale}"

    def forward(self, q, k, v, scale=None, mask=None, *more):
        T = q.size(-2)
        if mask is not None and self.mask_kind and isinstance(self.group, dist.ProcessGroup) \
                and q.device.type != "meta":
            terms = [(mask, self.mask_kind, self.mask_whole)] + [
                (m, kind, whole) for m, (kind, whole) in zip(more, self.more_masks)]
            refuse_terms(terms, load_balanced_positions(T, self.cp, self.rank, device=q.device),
                         self.group, self.cp, self.where)
        if k.size(-3) != q.size(-3):   # grouped-query attention handed over unrepeated (SDPA's enable_gqa)
            k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
            v = v.repeat_interleave(q.size(-3) // v.size(-3), dim=-3)
        kernel = kernel_for(q, self.group, self.sdpa)   # cp_torch_ring.choose_kernel
        if kernel == TORCH_RING:
            scale = scale if scale is not None else self.scale
            return torch_ring_attention(q, k, v, self.group, self.causal,
                                        float(scale) if scale is not None else None)
        if kernel != SHAPE_PROBE:
            k = GatherSeq.apply(k, self.group, k.dim() - 2)
            v = GatherSeq.apply(v, self.group, v.dim() - 2)
        else:   # the rewrite's shape probe (FakeGroup / meta): the gathered shape
            k = torch.cat([k] * self.cp, dim=-2)
            v = torch.cat([v] * self.cp, dim=-2)
        scale = scale if scale is not None else self.scale
        scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
        att = (q @ k.transpose(-2, -1)) * scale
        if self.causal:
            pq = load_balanced_positions(T, self.cp, self.rank, device=q.device)
            pk = torch.cat([load_balanced_positions(T, self.cp, r, device=q.device)
                            for r in range(self.cp)])
            att = att.masked_fill(pk[None, :] > pq[:, None], float("-inf"))
        att = torch.softmax(att.float(), dim=-1).to(q.dtype)
        return att @ v
