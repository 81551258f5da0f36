"""Expert parallelism in autopar's runtime: each MoE layer's routed experts sharded over the ep
ranks of a pipeline stage, tokens exchanged with ``all_to_all_single``.

The ep group of a rank (``expert_mesh``: ``ep`` ranks of the stage's dp·cp·tp, at one tp
coordinate where ep divides dp·cp, else taking the tp ranks first as Megatron-core's expert mesh
does) holds every expert once: position ``j`` (the rank's index in the sorted group) keeps
experts ``[j·E/ep, (j+1)·E/ep)`` (a contiguous slice of the stacked weights). The expert-dp group
is the ranks at the same position in the stage's other ep groups, which hold the same experts.

Forward of a MoE layer (``ep_dispatch_compute_combine``, in place of
``Experts.dispatch_compute_combine``): this rank's token-expert assignments, sorted by expert,
are sent to the experts' owners (the counts first, then the tokens: one ``all_to_all_single``
each, gloo and NCCL alike), regrouped by local expert, run, sent back, weighted and summed
into their tokens. ``torch.distributed.nn.functional.all_to_all_single`` carries the gradient
back the same way. Dropless (every assignment computed): a capacity factor is not applied
under ep, whose capacity would be per rank rather than the serial model's per batch.

Gradients: DDP all-reduces the dense parameters over dp (mean) and is told to ignore the expert
shards; after the backward ``reduce_expert_grads`` sums each expert shard's gradient over its
expert-dp group and divides by dp·cp: an expert owner's gradient already holds the tokens of its
whole ep group, so the sum over the expert-dp groups covers every rank's tokens once — the
serial model's mean gradient. Under tp each tp rank routes its own tokens
(``autopar.rewrite.experts``) and exchanges them in its ep group, so the expert-dp group spans
the tp ranks too (at ep = 1 as well: the experts are then reduced here, not by DDP). ZeRO-1 partitions
the dense parameters only; each rank steps its own expert shards (``Zero1(private=...)``);
ZeRO-2/3 shard the dense parameters with FSDP2, which is told to leave the expert shards whole
(``ignored_params``). ``full_state_dict`` all-gathers the shards over the ep group
(``gather_expert``).
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from autopar.runtime.step import expert_mesh

EXPERT_WEIGHTS = ("w1", "w2", "w3")


def ep_rank_sets(plan, layout) -> tuple[list[list[int]], list[list[int]]]:
    """(ep groups, expert-dp groups) of the whole plan as global rank lists (every rank builds
    the same lists: ``create_groups`` needs them on all). Under tp and cp an expert-dp group
    spans the tp and cp ranks too: each computes the experts on its own tokens
    (``reduce_expert_grads``); where ep does not divide dp·cp the ep group takes tp ranks
    (``expert_mesh``)."""
    return expert_mesh.all_rank_sets(plan, layout)


def moe_layers(module: nn.Module):
    """The routed experts of autopar's ``moe`` family inside ``module`` (``Experts``: whole in the
    serial model, the rewrite's leaf in a rewritten row)."""
    from autopar.models.moe import Experts
    return [m for m in module.modules() if isinstance(m, Experts)]


def has_experts(module: nn.Module) -> bool:
    """Whether ``module`` holds routed experts this runtime shards (autopar's or transformers')."""
    return bool(moe_layers(module) or hf_experts(module))


def shard_experts(stages: list[nn.Module], plan, layout) -> list[nn.Parameter]:
    """Keep this rank's slice of every MoE layer's experts and route through the ep exchange
    (autopar's ``Experts``; transformers' stacked ``gate_up_proj`` / ``down_proj`` experts, called
    as ``experts(hidden, top_k_index, top_k_weights)``); the expert shards (their gradients
    reduced by ``reduce_expert_grads``). At ep = 1 under tp the experts stay whole but are
    reduced the same way (each tp rank's gradient covers its own tokens only)."""
    ep = plan.ep
    ranks, _, j = expert_mesh.expert_groups(plan, layout)
    group = _group(ranks) if ep > 1 else None
    first = expert_mesh.counts_in_norm(plan, layout)
    shards = []
    for stage in stages:
        for m in moe_layers(stage):
            local = m.num_experts // ep
            if ep > 1:
                shards += _slice(m, EXPERT_WEIGHTS, j, local, ep, group)
                m.first, m.capacity_factor = j * local, 0.0
                m.dispatch_compute_combine = types.MethodType(ep_dispatch_compute_combine, m)
            else:
                shards += _mark(m, EXPERT_WEIGHTS)
        for parent, name, ex in hf_experts(stage):
            if ep == 1:
                shards += _mark(ex, HF_WEIGHTS)
                continue
            local = ex.num_experts // ep
            ep_ex = HFExpertShard(ex, j, local, ep, group)
            setattr(parent, name, ep_ex)
            shards += [ep_ex.gate_up_proj, ep_ex.down_proj]
    for p in shards:
        p.autopar_in_norm = first   # this rank's ep group is its stage's first (step/clipping.py)
        p.autopar_expert_first = j * (p.shape[0] if ep > 1 else 0)   # its serial rows (checkpoints/dcp.py)
    return shards


def _mark(module, names) -> list[nn.Parameter]:
    """The whole experts of ``module`` as expert shards of ep = 1."""
    out = [getattr(module, n) for n in names]
    for p in out:
        p.autopar_ep = 1
    module.ep, module.ep_group, module.autopar_expert_shard = 1, None, True
    return out


def _slice(module, names, j, local, ep, group) -> list[nn.Parameter]:
    out = []
    for name in names:
        full = getattr(module, name)
        p = nn.Parameter(full.detach()[j * local:(j + 1) * local].clone(), requires_grad=full.requires_grad)
        p.autopar_ep = ep   # gradient clipping counts each expert once (step/clipping.py)
        setattr(module, name, p)
        out.append(p)
    module.ep, module.ep_group, module.autopar_expert_shard = ep, group, True
    return out


HF_WEIGHTS = ("gate_up_proj", "down_proj")


def hf_experts(module: nn.Module):
    """(parent, attribute, experts) of transformers' stacked-weight experts inside ``module``."""
    out = []
    for parent in module.modules():
        ex = getattr(parent, "experts", None)
        if (isinstance(ex, nn.Module) and not isinstance(ex, HFExpertShard)
                and all(isinstance(getattr(ex, n, None), nn.Parameter) for n in HF_WEIGHTS)
                and isinstance(getattr(ex, "num_experts", None), int) and callable(getattr(ex, "act_fn", None))):
            out.append((parent, "experts", ex))
    return out


class HFExpertShard(nn.Module):
    """A transformers experts module's slice ``[first, first + local)`` of experts, run over the ep
    group: the same call (hidden, top_k_index, top_k_weights) and result as the whole module."""

    def __init__(self, ex: nn.Module, j: int, local: int, ep: int, group):
        super().__init__()
        self.act_fn, self.num_experts, self.first = ex.act_fn, local, j * local
        self.global_experts = ex.num_experts
        for name in HF_WEIGHTS:
            full = getattr(ex, name)
            setattr(self, name, nn.Parameter(full.detach()[j * local:(j + 1) * local].clone(),
                                             requires_grad=full.requires_grad))
            getattr(self, name).autopar_ep = ep
        self.ep, self.ep_group, self.autopar_expert_shard = ep, group, True

    def run(self, x, counts: list[int]):
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start:start + n]
            gate, up = nn.functional.linear(xe, self.gate_up_proj[e]).chunk(2, dim=-1)
            outs.append(nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e]))
            start += n
        return torch.cat(outs) if outs else x[:0]

    def forward(self, hidden, top_k_index, top_k_weights):
        k = top_k_index.size(-1)
        flat = top_k_index.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.global_experts).tolist()
        token = order // k
        out = exchange(hidden[token], counts, self.ep, self.ep_group, self.run)
        out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
        return torch.zeros_like(hidden).index_add(0, token, out.to(hidden.dtype))


def check_expert_model(model: nn.Module, plan) -> None:
    """ep needs MoE layers this runtime can shard: those of autopar's ``moe`` family, each with
    experts divisible by ep (one line otherwise, before any process starts)."""
    from costmodels.contracts.errors import PlanError
    layers = moe_layers(model) + [ex for _, _, ex in hf_experts(model)]
    if not layers:
        raise PlanError(f"plan field 'ep'={plan.ep}: autopar's runtime shards the experts of its own "
                        "moe family and transformers' stacked experts (gate_up_proj / down_proj) and "
                        "finds none in this model; "
                        "use ep=1, or plan for runtime megatron and export")
    for m in layers:
        if m.num_experts % plan.ep:
            raise PlanError(f"plan field 'ep'={plan.ep} does not divide the {m.num_experts} experts "
                            "of a MoE layer; choose ep dividing the experts")


def check_expert_sequence_parallel(model: nn.Module, plan) -> None:
    """Sequence parallel on transformers' MoE blocks: they flatten the tokens
    (``hidden_states.view(-1, hidden)``) before the router, which merges the sequence shard with
    the batch; refused in one line (tp without sp runs them: ``autopar.rewrite.experts``)."""
    if plan.sequence_parallel and hf_experts(model):
        from costmodels.contracts.errors import PlanError
        raise PlanError("plan field 'sequence_parallel'=true: transformers' MoE blocks flatten the "
                        "tokens (view(-1, hidden)) before their router, merging the sequence shard "
                        "with the batch, which the rewrite cannot shard; use sequence_parallel=false "
                        "(tp runs them without it)")


def check_expert_capacity(model: nn.Module, plan) -> None:
    """A capacity factor caps an expert's tokens per batch, the first in token order: with the
    tokens split over tp or cp ranks each rank would cap its own part, which is not the serial
    model's drop; refused in one line (expert parallelism runs dropless, module docstring)."""
    split = [f"'{f}'={getattr(plan, f)}" for f in ("tp", "cp") if getattr(plan, f, 1) > 1]
    if split and plan.ep == 1 and any(m.capacity_factor for m in moe_layers(model)):
        from costmodels.contracts.errors import PlanError
        raise PlanError(f"plan field {split[0]} splits the tokens of a MoE layer with a capacity factor "
                        "over ranks, each capping its own part, which is not the serial model's drop; "
                        "use capacity_factor=0 (dropless), ep > 1 (which runs dropless) or tp=1, cp=1")


def expert_param_names(stage: nn.Module) -> list[str]:
    """Names (in ``stage``) of its expert shards, for DDP to ignore."""
    return [f"{mn}.{pn}" if mn else pn for mn, m in stage.named_modules()
            if getattr(m, "autopar_expert_shard", False) for pn, _ in m.named_parameters(recurse=False)]


class AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with its gradient: the same exchange with the splits swapped."""

    @staticmethod
    def forward(ctx, x, recv: list[int], send: list[int], group):
        ctx.recv, ctx.send, ctx.group = recv, send, group
        out = x.new_empty(sum(recv), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty(sum(ctx.send), *grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def exchange(x, counts: list[int], ep: int, group, run):
    """Rows ``x`` (token-expert assignments sorted by global expert, ``counts`` per expert) sent
    to their experts' owners, run there (``run(rows sorted by local expert, counts per local
    expert)``) and returned in ``x``'s order."""
    local = len(counts) // ep
    cnt = torch.tensor(counts, dtype=torch.int64).view(ep, local)
    got = torch.empty_like(cnt)
    dist.all_to_all_single(got, cnt, group=group)          # got[s, e]: source s → local expert e
    send, recv = cnt.sum(1).tolist(), got.sum(1).tolist()
    y = AllToAll.apply(x, recv, send, group)
    sizes = got.reshape(-1).tolist()                        # source-major
    starts, s = [], 0
    for n in sizes:
        starts.append(s)
        s += n
    perm = torch.cat([torch.arange(starts[src * local + e], starts[src * local + e] + sizes[src * local + e])
                      for e in range(local) for src in range(ep)])
    z = run(y[perm], got.sum(0).tolist())                   # expert-major
    back = torch.empty_like(z).index_copy(0, perm, z) if z.numel() else z
    return AllToAll.apply(back, send, recv, group)


def ep_dispatch_compute_combine(self, flat, order, counts, weights):
    """``Experts.dispatch_compute_combine`` over the ep group (module docstring)."""
    token = order // self.top_k
    out = exchange(flat[token], counts, self.ep, self.ep_group, self.run)
    out = out * weights[order].unsqueeze(-1)
    return torch.zeros_like(flat).index_add(0, token, out)


def reduce_expert_grads(shards: list[nn.Parameter], plan, layout) -> None:
    """Sum the expert shards' gradients over their expert-dp group (× the tp and cp ranks) and
    divide by dp·cp (a cp rank's loss is the mean over its part of the sequence, as DDP's mean
    over dp·cp assumes for the dense parameters)."""
    grads = [p.grad for p in shards if p.grad is not None]
    if not grads:
        return
    cp = getattr(plan, "cp", 1)
    _, edp, _ = expert_mesh.expert_groups(plan, layout)
    if len(edp) > 1:
        group = _group(edp)
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        for g, new in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(new)
    for g in grads:
        g.div_(plan.dp * cp)


def gather_expert(stage: nn.Module, name: str, t: torch.Tensor) -> torch.Tensor:
    """The whole stacked expert tensor for ``name`` (a shard of ``stage``), else ``t``."""
    owner = name.rpartition(".")[0]
    try:
        m = stage.get_submodule(owner)
    except AttributeError:
        return t
    if not getattr(m, "autopar_expert_shard", False) or m.ep == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(m.ep)]
    dist.all_gather(parts, t.contiguous(), group=m.ep_group)
    return torch.cat(parts, 0)


def _group(ranks):
    from autopar.runtime.faults import dist as adist
    return adist.group(ranks)
