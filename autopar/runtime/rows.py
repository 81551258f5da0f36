"""Cut a model into the layer table's rows: embedding, blocks.0 … blocks.L-1, head.

Each row is a module taking one tensor (the embedding row takes the model's inputs) and returning
one tensor, so any contiguous range of rows is a pipeline stage.

* Built-in models (``autopar/models``) have top-level children ``embedding``, ``blocks``
  (ModuleList) and ``head``: the rows are those modules themselves.
* Any other model (a user's nanoGPT-style code): the largest ModuleList / Sequential of
  same-class modules (the trace's rule) gives the blocks. The top-level ``forward`` is traced
  with torch.fx keeping the blocks as leaf calls; what runs before the first block becomes the
  embedding row and what runs after the last becomes the head row (two GraphModules that share
  the original submodules and parameters, so a tied embedding stays one Parameter). Arguments
  with defaults (``targets=None``) are traced at their default; a Python ``assert`` on a shape
  in that top-level forward is taken as true.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx
import torch.nn as nn

from costmodels.errors import PlanError


@dataclass
class Rows:
    modules: list[nn.Module]
    kinds: list[str]            # "embedding" | "block" | "head"
    names: list[str]            # "embedding", "blocks.3", "head" (or the user model's block path)
    prefixes: list[str]         # where the row's parameter names sit in the model's state dict

    def __len__(self) -> int:
        return len(self.modules)


def model_rows(model: nn.Module) -> Rows:
    children = dict(model.named_children())
    if ("embedding" in children and "head" in children
            and isinstance(children.get("blocks"), nn.ModuleList)):
        blocks = list(model.blocks)
        names = ["embedding"] + [f"blocks.{i}" for i in range(len(blocks))] + ["head"]
        return Rows([model.embedding, *blocks, model.head],
                    ["embedding"] + ["block"] * len(blocks) + ["head"], names, names)
    return _split_with_fx(model)


def _largest_block_list(model: nn.Module) -> tuple[str, nn.Module]:
    """The same block list the trace picks (``autopar.trace.blocks.find_block_list``), so the
    runtime's rows are the layer table's rows."""
    from autopar.trace.blocks import find_block_list
    best = find_block_list(model)
    if best is None:
        raise PlanError(f"cannot find the repeated blocks of {type(model).__name__}: autopar cuts a "
                        "model at its largest nn.ModuleList / nn.Sequential of same-class blocks, "
                        "and there is none")
    return best


class _RowTracer(fx.Tracer):
    def __init__(self, block_ids):
        super().__init__()
        self.block_ids = block_ids

    def is_leaf_module(self, m, qualname):
        return id(m) in self.block_ids or super().is_leaf_module(m, qualname)

    def to_bool(self, obj):  # ``assert T <= block_size`` in a forward: take it as true
        return True


def _split_with_fx(model: nn.Module) -> Rows:
    import inspect
    list_name, blocks = _largest_block_list(model)
    names = [f"{list_name}.{i}" for i in range(len(blocks))]
    concrete = {p.name: p.default for p in inspect.signature(model.forward).parameters.values()
                if p.default is not inspect.Parameter.empty}
    try:
        graph = _RowTracer({id(b) for b in blocks}).trace(model, concrete_args=concrete or None)
    except Exception as e:
        raise PlanError(f"cannot cut {type(model).__name__}.forward into rows with torch.fx "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                        "use pp=1 and tp=1, or make the top-level forward fx-traceable") from None
    nodes = list(graph.nodes)
    calls = [n for n in nodes if n.op == "call_module" and n.target in names]
    where = f"{type(model).__name__}.forward"
    if [n.target for n in calls] != names:
        raise PlanError(f"{where} must call {list_name}[0] … {list_name}[{len(blocks) - 1}] once "
                        "each, in order, for autopar to cut it into pipeline rows")
    for i, n in enumerate(calls):
        if n.kwargs or len(n.args) != 1 or (i and n.args[0] is not calls[i - 1]):
            raise PlanError(f"{where}: block {names[i]} must take exactly the previous block's "
                            "output as its only argument, for autopar to cut it into rows")
    first, last = nodes.index(calls[0]), nodes.index(calls[-1])
    if any(n not in calls for n in nodes[first:last + 1]):
        raise PlanError(f"{where} runs other code between its blocks; autopar can cut only "
                        "'embedding → blocks → head' models into pipeline rows")
    pre, post = nodes[:first], nodes[last + 1:]
    pre_set = set(pre)
    for n in pre:
        for u in n.users:
            if getattr(u, "target", None).__class__.__name__ == "function" and \
                    getattr(u.target, "__name__", "") == "_assert_is_none":
                continue
            if u not in pre_set and u is not calls[0] and n.op != "get_attr":
                raise PlanError(f"{where}: '{n.name}' computed before the blocks is used after "
                                "them; autopar needs the blocks' output to be all that flows on")
    x = calls[0].args[0]
    if not isinstance(x, fx.Node) or x not in pre_set:
        raise PlanError(f"{where}: the first block's input must be computed from the inputs")

    from torch.fx._symbolic_trace import _assert_is_none
    g_pre = fx.Graph()
    env: dict = {}
    for n in pre:
        if n.op == "call_function" and n.target is _assert_is_none:
            continue  # fx's check that an argument traced at its default is still that default
        env[n] = g_pre.node_copy(n, lambda a: env[a])
    g_pre.output(env[x])
    for n in list(g_pre.nodes):
        if n.op == "placeholder" and not n.users and n.args:  # unused, with a default
            g_pre.erase_node(n)
    g_post = fx.Graph()
    env = {calls[-1]: g_post.placeholder("x")}
    for n in post:
        for a in n.all_input_nodes:
            if a not in env:  # a get_attr from before the blocks
                env[a] = g_post.node_copy(a, lambda b: env[b])
        env[n] = g_post.node_copy(n, lambda a: env[a])
    pre_gm, post_gm = fx.GraphModule(model, g_pre), fx.GraphModule(model, g_post)
    return Rows([pre_gm, *blocks, post_gm], ["embedding"] + ["block"] * len(blocks) + ["head"],
                ["embedding"] + names + ["head"], [""] + names + [""])


class StageModule(nn.Module):
    """A contiguous range of rows run one after the other (one pipeline virtual stage)."""

    def __init__(self, rows: list[nn.Module], kinds: list[str]):
        super().__init__()
        self.rows = nn.ModuleList(rows)
        self.kinds = list(kinds)

    def forward(self, *args):
        x = self.rows[0](*args)
        for row in self.rows[1:]:
            x = row(x)
        return x


def row_weights(rows: Rows) -> list[float]:
    """A FLOP proxy per row when no layer table is at hand: matmul parameters (an embedding
    lookup costs ~nothing, a linear 6 FLOPs per parameter per token) plus one."""
    out = []
    for m in rows.modules:
        seen, w = set(), 0
        for mod in m.modules():
            if isinstance(mod, nn.Embedding):
                continue
            for p in mod.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    w += p.numel()
        out.append(float(w + 1))
    return out
