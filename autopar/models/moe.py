"""Mixture of Experts: a Llama block whose MLP is a router, E routed SwiGLU experts and optional
shared experts (Mixtral, Qwen3-MoE, DeepSeek-V3 without MLA), after ``dense_layers`` leading
dense Llama blocks (DeepSeek-V3's ``first_k_dense_replace``).

Rows: ``embedding``, ``blocks.i``, ``head``, as Llama. Per MoE block, beside attention:
``h·E`` router weights, ``3·h·f·E`` routed-expert weights (``f`` = ``expert_ffn``) and
``3·h·f·shared`` shared-expert weights.

The routed experts are stacked weights (``Experts.w1`` of shape (E, f, h), ...), run as a loop
over the experts on the tokens sorted by expert (what a grouped GEMM runs in one kernel). Each
token goes to its ``top_k`` experts of highest softmax probability, weighted by those
probabilities renormalised to sum to 1 (Mixtral's and Qwen3-MoE's ``norm_topk_prob``). With a
``capacity_factor`` c > 0 an expert computes at most ``ceil(c·tokens·top_k / E)`` of its tokens
(the first in token order; the rest are dropped, as Switch / GShard do); 0 is dropless.

Traced on meta values (``autopar.trace``), routing is unknowable: the trace runs the balanced
routing the cost model assumes (every expert gets ``tokens·top_k / E`` tokens), so the FLOPs it
counts are those of the ``top_k`` of E experts each token actually runs.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.models.config import ModelConfig
from autopar.models.llama import GQAttention, Llama, RMSNorm, SwiGLU
from autopar.models.mla import MLAttention, uses_mla
from costmodels.contracts.errors import SpecError


def check_moe_config(cfg: ModelConfig) -> None:
    """The MoE settings against each other (one SpecError line each)."""
    if cfg.top_k > cfg.experts:
        raise SpecError(f"top_k={cfg.top_k} is above experts={cfg.experts}; each token goes to "
                        "top_k distinct experts: choose top_k <= experts")
    if cfg.dense_layers >= cfg.layers:
        raise SpecError(f"dense_layers={cfg.dense_layers} leaves no MoE block of layers={cfg.layers}; "
                        "choose dense_layers < layers (or use the llama family)")


class Router(nn.Module):
    """Linear gate, softmax over the experts, the top-k renormalised."""

    def __init__(self, hidden: int, experts: int, top_k: int):
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.top_k = top_k

    def forward(self, x):
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, index = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), index


class Experts(nn.Module):
    """E SwiGLU experts as stacked weights, with their routing: ``forward(flat, index, weights)``
    takes the tokens, each token's ``top_k`` experts and router weights, sorts the token-expert
    assignments by expert (dropping those above the capacity), runs each expert on its tokens (a
    grouped GEMM's inputs: ``run``) and adds each output back to its token, weighted. ``first``
    is the global index of expert 0 here (expert parallelism keeps a contiguous slice).

    One module call for all the data-dependent routing, so that the tensor-parallel rewrite
    keeps it whole (a leaf of its fx graph: ``autopar.rewrite.experts``) and the router, the
    shared experts and attention around it stay ordinary traced code."""

    def __init__(self, experts: int, hidden: int, ffn: int, first: int = 0, top_k: int = 1,
                 capacity_factor: float = 0.0):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.num_experts, self.first = experts, first
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.w1, self.w3, self.w2):
            nn.init.normal_(w, mean=0.0, std=0.02)

    def capacity(self, tokens: int) -> int | None:
        if not self.capacity_factor:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts)

    def forward(self, x, index, weights):
        """``x`` (..., h) tokens, ``index`` / ``weights`` (..., top_k): the routed output, x's shape."""
        flat = x.reshape(-1, x.size(-1))
        if flat.is_meta:   # traced: balanced routing (module docstring)
            n = flat.size(0) * self.top_k // self.num_experts
            order = torch.arange(n * self.num_experts, device=flat.device)
            counts = [n] * self.num_experts
        else:
            order, counts = route(index, self.num_experts, self.top_k, self.capacity(flat.size(0)))
        return self.dispatch_compute_combine(flat, order, counts, weights.reshape(-1)).view_as(x)

    def dispatch_compute_combine(self, flat, order, counts, weights):
        """Gather the tokens in expert order, run the experts, add each output back to its
        token weighted by its router weight (the one place expert parallelism replaces)."""
        token = order // self.top_k
        out = self.run(flat[token], counts) * weights[order].unsqueeze(-1)
        return torch.zeros_like(flat).index_add(0, token, out)

    def run(self, x, counts: list[int]):
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start:start + n]
            h = F.silu(xe @ self.w1[e].t()) * (xe @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
            start += n
        return torch.cat(outs) if outs else x[:0]


def route(index: torch.Tensor, experts: int, top_k: int, capacity: int | None):
    """(order, counts): the token-expert assignments (flattened ``index``) sorted by expert,
    stable in token order, and the count per expert, the assignments above ``capacity`` per
    expert dropped."""
    flat = index.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=experts)
    if capacity is not None:
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
        order = order[pos < capacity]
        counts = counts.clamp(max=capacity)
    return order, counts.tolist()


class MoEFFN(nn.Module):
    """Router, routed experts, shared experts: ``y = Σ_k w_k·expert_k(x) + shared(x)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.router = Router(cfg.hidden, cfg.experts, cfg.top_k)
        self.experts = Experts(cfg.experts, cfg.hidden, cfg.expert_ffn_dim, top_k=cfg.top_k,
                               capacity_factor=cfg.capacity_factor)
        self.shared = (SwiGLU(cfg.hidden, cfg.shared_experts * cfg.expert_ffn_dim)
                       if cfg.shared_experts else None)
        self.num_experts, self.top_k = cfg.experts, cfg.top_k

    def forward(self, x):
        weights, index = self.router(x)      # per token; (B, T, ·) kept so that a sequence-
        y = self.experts(x, index, weights)  # parallel shard stays one (the rewrite's dim 1)
        if self.shared is not None:
            y = y + self.shared(x)
        return y


class MoEBlock(nn.Module):
    """One class for dense and MoE blocks (as transformers' DeepSeek-V3 decoder layer), so the
    blocks are one list the trace and the runtime cut into rows."""

    def __init__(self, cfg: ModelConfig, attention: str, dense: bool = False):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = MLAttention(cfg, attention) if uses_mla(cfg) else GQAttention(cfg, attention)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.ffn_dim) if dense else MoEFFN(cfg)

    def forward(self, x):
        x = x + self.attn(self.attention_norm(x))
        return x + self.mlp(self.ffn_norm(x))


class MoE(Llama):
    """Llama's embedding, head and forward over MoE blocks (the first ``dense_layers`` dense);
    ``init_weights`` initialises linears and embeddings, the experts initialised themselves."""

    def _block(self, cfg: ModelConfig, attention: str, index: int) -> nn.Module:
        return MoEBlock(cfg, attention, dense=index < cfg.dense_layers)
