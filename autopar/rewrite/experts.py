"""The routed experts of a Mixture of Experts under tensor / sequence parallelism.

A MoE layer's routing is data-dependent (sort by expert, counts per expert, a loop over the
experts hit), which neither ``torch.fx`` nor a meta trace can follow. So the rewrite keeps the
*routed experts module* whole — autopar's ``Experts`` and transformers' stacked-weight experts
(Mixtral, Qwen2/3-MoE, DeepSeek-V3), both called as ``experts(tokens, top_k_index,
top_k_weights)`` — as a leaf of the row's graph: ``is_expert_module`` says which modules,
``ExpertLeafTracer`` keeps them whole in the fx trace, and the router, the shared experts and
attention around them are traced and sharded as any other code (the shared experts' SwiGLU is
a column/row pair like a dense MLP).

Tokens under tp (each tp rank routes and computes 1/tp of the tokens, as the cost model prices
it, ``costmodels.model.experts``: "the tokens of one GPU: dispatch_bytes/tp"):

* sequence parallel: the leaf's inputs are already this rank's sequence shard (autopar's
  ``MoEFFN`` keeps (B, T, ·) up to the leaf, so the shard is dim 1): it runs on them as they
  are and its output stays sharded (dispatch per sp shard, no gather);
* tp without sp: the inputs are replicated; ``TokenSplit`` keeps this rank's contiguous
  ``tensor_split`` of the flattened tokens (backward: all-gather, so the replicated producer
  gets the whole gradient on every rank), the leaf runs on them, ``TokenGather`` all-gathers
  the outputs (backward: this rank's part of the replicated gradient).

transformers' MoE blocks flatten the tokens (``view(-1, hidden)``) before the router, which
merges the sequence shard with the batch: the rewrite refuses that under sequence parallel in
one line (tp without sp runs them).

Either way an expert weight's gradient on one tp rank covers only that rank's tokens; the
runtime sums it over tp with the expert-dp reduction (``autopar.runtime.step.experts``). Under
expert parallelism every tp rank exchanges its own tokens within the ep group at its tp
coordinate. Uneven splits (tokens not divisible by tp) are allowed: the gather pads to the
largest part.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from autopar.rewrite.collectives import _Collective, _fake, group_rank, group_size

EXPERT_WEIGHT_SETS = (("w1", "w2", "w3"), ("gate_up_proj", "down_proj"))


def is_expert_module(mod) -> bool:
    """A routed-experts module called as ``(tokens, top_k_index, top_k_weights)``: stacked
    3-D expert weights (autopar's w1/w2/w3, transformers' gate_up_proj/down_proj) and an int
    ``num_experts``."""
    if not isinstance(mod, nn.Module) or not isinstance(getattr(mod, "num_experts", None), int):
        return False
    own = mod._parameters   # not getattr: fx's tracer hands out proxies for parameters
    return any(all(own.get(n) is not None and own[n].dim() == 3 for n in names) for names in EXPERT_WEIGHT_SETS)


def expert_class_names(module: nn.Module) -> tuple[str, ...]:
    """Class names of the routed-experts modules inside ``module`` (leaves of a meta trace)."""
    return tuple(sorted({type(m).__name__ for m in module.modules() if is_expert_module(m)}))


def expert_meta_output(mod, args, kwargs):
    """The leaf's output on meta (tokens' shape and dtype): the value shape propagation needs;
    None for any other module. transformers' expert loop (``nonzero``) cannot run on meta."""
    if is_expert_module(mod) and args and isinstance(args[0], torch.Tensor):
        return torch.empty_like(args[0], device="meta")
    return None


class ExpertLeafTracer(fx.Tracer):
    """``torch.fx``'s tracer keeping routed-experts modules whole (one ``call_module`` node)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return is_expert_module(m) or super().is_leaf_module(m, qualname)


def _parts(n: int, tp: int) -> list[int]:
    return [len(c) for c in torch.arange(n).tensor_split(tp)]


def _gather_uneven(x, sizes: list[int], group):
    """All ranks' parts of ``x`` (``sizes`` rows each) concatenated along dim 0."""
    if _fake(group) or x.is_meta:
        return x.new_empty((sum(sizes),) + tuple(x.shape[1:]))
    top = max(sizes)
    pad = x.new_zeros((top,) + tuple(x.shape[1:]))
    pad[:x.shape[0]] = x
    parts = [torch.empty_like(pad) for _ in sizes]
    dist.all_gather(parts, pad.contiguous(), group=group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


class _TokenSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        tp = group_size(group)
        flat = x.reshape(-1, x.shape[-1])
        ctx.group, ctx.sizes, ctx.shape = group, _parts(flat.shape[0], tp), x.shape
        return flat.tensor_split(tp)[group_rank(group)].contiguous()

    @staticmethod
    def backward(ctx, g):
        return _gather_uneven(g.contiguous(), ctx.sizes, ctx.group).view(ctx.shape), None


class _TokenGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shape, group):
        tp = group_size(group)
        ctx.group, ctx.rank, ctx.tp = group, group_rank(group), tp
        total = 1
        for d in shape[:-1]:
            total *= d
        return _gather_uneven(x.contiguous(), _parts(total, tp), group).view(shape)

    @staticmethod
    def backward(ctx, g):
        flat = g.reshape(-1, g.shape[-1])
        return flat.tensor_split(ctx.tp)[ctx.rank].contiguous(), None, None


class TokenSplit(_Collective):
    fwd, bwd = "split(tokens)", "all-gather(tokens)"

    def forward(self, x):
        return _TokenSplit.apply(x, self.group)


class TokenGather(_Collective):
    """All tp ranks' expert outputs, in the shape of ``like``, the replicated input the tokens
    were split from."""
    fwd, bwd = "all-gather(tokens)", "split(tokens)"

    def forward(self, x, like):
        return _TokenGather.apply(x, tuple(like.shape), self.group)


class ExpertNodes:
    """The rewrite's handling of a routed-experts leaf node (mixed into ``tp._Rewriter``)."""

    def _is_expert_leaf(self, n) -> bool:
        return n.op == "call_module" and is_expert_module(self._mod(n))

    def _experts(self, n):
        import copy

        from autopar.rewrite.node_source import where
        from costmodels.contracts.errors import TraceError
        tokens = n.args[0]
        dim = self.shard_of(tokens)
        if dim is not None and dim == self.full[tokens].dim() - 1:
            raise TraceError(f"tensor-parallel rewrite: the routed experts {n.target} get tokens "
                             f"sharded on their hidden dim {dim}, not a token dim{where(n)}")
        args = list(fx.node.map_arg(n.args, lambda a: self.env[a]))
        kwargs = dict(fx.node.map_arg(n.kwargs, lambda a: self.env[a]))
        if dim is None and self.tp > 1:   # replicated tokens: this rank's part of them
            split = lambda a: (self._collective(TokenSplit, a, f"{n.target}_split")  # noqa: E731
                               if isinstance(a, fx.Node) and isinstance(self.local.get(a), torch.Tensor) else a)
            args, kwargs = [split(a) for a in args], {k: split(v) for k, v in kwargs.items()}
        self._module(n.target, copy.deepcopy(self._mod(n)))
        node = self._add("call_module", n.target, args, kwargs, src=n, name=n.name)
        if dim is None and self.tp > 1:
            name = self._name(f"{n.target}_gather")
            self.root[name] = TokenGather(self.group)
            node = self._add("call_module", name, (node, self.env[tokens]), name=name.replace(".", "_"))
        self.env[n] = node
        self.needs_grad[node] = dim is None
        self._check(n)


@contextlib.contextmanager
def experts_shape_only(module: nn.Module):
    """Within: every routed-experts module of ``module`` returns an empty tensor of its tokens'
    shape instead of routing (shape propagation under FakeTensorMode, which cannot follow the
    data-dependent routing; ``autopar.runtime.assemble.stages.row_inputs``)."""
    found = [m for m in module.modules() if is_expert_module(m)]
    for m in found:
        m.forward = lambda x, *a, **k: torch.empty_like(x)
    try:
        yield
    finally:
        for m in found:
            del m.forward
