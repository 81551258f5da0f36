"""The one row cutter: a model's top-level forward cut into the layer table's rows, as runnable
modules, with the trace's own graph and row rule.

The trace (``autopar.trace.driver``) prices rows ``embedding, block calls…, head`` of the graph
that ``trace_call`` records with the repeated blocks as leaves, rows assigned by
``autopar.trace.blocks.assign_rows``. The runtime must run exactly those rows, so it cuts that
same graph here rather than tracing the model a second way.

Any value a later row needs crosses each cut: a row takes the *carry* at its start and returns
the carry at its end, where the carry at a cut is every value computed before it and used after
it (live-variable analysis on the fx graph). Transformers decoder layers thus receive their
attention mask, position ids and rotary ``(cos, sin)`` tables on every pipeline stage; a
``(cos, sin)`` tuple crosses as its two tensors and is rebuilt on the other side; buffers and
parameters read with ``get_attr`` are read again in each row that uses them instead. A block
called as ``x = block(x)`` whose row carries nothing else stays the block module itself (the
tensor-parallel rewrite shards it as before); any other row is an ``fx.GraphModule`` over the
user's model (parameters shared, so tied weights stay one tensor).

On a ``meta`` model (built under ``torch.device("meta")``, to materialise row by row) the
tensors a forward makes from constants (``torch.arange`` position ids, ``torch.ones`` masks)
would be ``meta`` constants nothing fills: the tensor factories are then recorded as graph nodes
(``tracer.recorded_factories``), so each row recomputes them on its rank's device.

The graph is traced on the model itself for one micro-batch's input shapes (``example_inputs``;
one forward on real values, so tensors the forward creates from constants keep their values,
random state restored), so shapes read in the forward are fixed to them; the device the trace
ran on is replaced by the row input's device (the runtime moves rows to the GPU afterwards).
The model's output is reduced to its logits (``autopar.models.outputs``), and a model taking
``targets`` is traced with them, as it trains.
"""
from __future__ import annotations

import contextlib
import copy
import operator
import types
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.node import map_aggregate

from autopar.models.outputs import forward_kwargs, model_logits
from autopar.trace.batch_norm import frozen_batch_statistics
from autopar.trace.blocks import assign_rows, block_modules, find_block_list, structure_groups
from autopar.trace.crossing import dead_elements
from autopar.trace.tracer import trace_call
from costmodels.contracts.errors import TraceError


@dataclass
class CutRows:
    modules: list[nn.Module]
    kinds: list[str]            # "embedding" | "block" | "head"
    names: list[str]            # "embedding", the block's module path, "head"


class RowModule(fx.GraphModule):
    """A cut row: a GraphModule named after its block (``LlamaDecoderLayerRow``) in every copy
    (fx's deepcopy would rename it ``GraphModule``), so the rewrite's messages name the block;
    ``autopar_inputs`` (meta values of all its inputs, for the rewrite) survives copies too."""

    autopar_inputs: tuple = ()

    def __deepcopy__(self, memo):
        res = super().__deepcopy__(memo)
        type(res).__name__ = type(self).__name__
        res.autopar_inputs = self.autopar_inputs
        return res


def meta_copy(module: nn.Module) -> nn.Module:
    """A deep copy whose parameters and buffers are on ``meta`` (no data copied; ties kept)."""
    memo: dict[int, object] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in memo:
            m = torch.empty_like(t, device="meta")
            memo[id(t)] = nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else m
    return deepcopy_rebound(module, memo)


def deepcopy_rebound(module: nn.Module, memo: dict) -> nn.Module:
    """``copy.deepcopy`` whose copied modules' function attributes refer to the copies: deepcopy
    keeps a function as it is, so minGPT's ``self.mlpf = lambda x: m.c_proj(m.act(m.c_fc(x)))``
    would still call the *original* ``m`` — a module the copy does not install ('module is not
    installed as a submodule' in the rewrite). Closure cells holding a copied object are rebuilt
    to hold its copy."""
    out = copy.deepcopy(module, memo)
    for m in out.modules():
        for name, fn in list(vars(m).items()):
            if not isinstance(fn, types.FunctionType) or not fn.__closure__:
                continue
            cells = tuple(types.CellType(memo.get(id(c.cell_contents), c.cell_contents)) for c in fn.__closure__)
            if any(a.cell_contents is not b.cell_contents for a, b in zip(cells, fn.__closure__)):
                new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, cells)
                new.__kwdefaults__ = fn.__kwdefaults__
                object.__setattr__(m, name, new)
    return out


def _on(t, device: torch.device):
    """An example input on the model's device (zeros where it has no values: ``meta``)."""
    if not isinstance(t, torch.Tensor) or t.device == device:
        return t
    return torch.zeros_like(t, device=device) if t.is_meta else t.to(device)


def cut_rows(model: nn.Module, example_inputs: tuple, leaf_classes=()) -> CutRows:
    """``model`` cut into embedding, one row per block, head (see the module docstring)."""
    from autopar.trace.driver import cache_off, tracing_libraries
    where = type(model).__name__
    found = find_block_list(model)
    if found is None:
        raise TraceError(f"cannot find the repeated blocks of {where}: autopar cuts a model at its "
                         "largest nn.ModuleList / nn.Sequential / nn.ModuleDict of same-class blocks")
    blocks = block_modules(found[1])
    device = next(iter(model.parameters()), torch.empty(0)).device
    inputs = tuple(_on(t, device) for t in example_inputs)
    with tracing_libraries(), cache_off(model), torch.random.fork_rng(devices=[]), frozen_batch_statistics(model):
        top, _ = trace_call(model, inputs, forward_kwargs(model, inputs), leaf_classes=leaf_classes,
                            leaf_modules=blocks, what=where,
                            output_cache=_hidden_like if device.type == "meta" else None,
                            record_factories=device.type == "meta" and not _SHAPES_ONLY[0])
    _keep_logits_only(top)
    rows, node_row = assign_rows(top, blocks, structure_groups(blocks))
    if len(rows) != len(blocks) + 2 or any("#" in r.name for r in rows):
        raise TraceError(f"{where}.forward must call each of its {len(blocks)} blocks "
                         f"({found[0]}) once, for autopar to cut it into rows")
    root = nn.Module()
    root.inner = model
    for n in top.graph.nodes:   # tensors the forward made from constants (fx's _tensor_constant*)
        if n.op == "get_attr" and "." not in n.target and isinstance(getattr(top, n.target, None), torch.Tensor):
            root.register_buffer(n.target, getattr(top, n.target), persistent=False)
    nodes = [n for n in top.graph.nodes if n.op != "output"]
    row_of = {n: node_row[n.name] for n in nodes}
    out_node = next(n for n in top.graph.nodes if n.op == "output")
    carries = [_hidden_first(_carry(nodes, row_of, c), rows, c) for c in range(len(rows) + 1)]
    dead = {n: _dead_slots(n, row_of) for c in carries for n in c}
    modules = []
    for r, info in enumerate(rows):
        mine = [n for n in nodes if row_of[n] == r and n.op not in ("placeholder", "get_attr")]
        if info.kind == "block" and _plain_call(info.call_node, mine, carries[r], carries[r + 1]):
            modules.append(root.get_submodule(info.call_node.target))
            continue
        ins = [n for n in nodes if n.op == "placeholder" and n.users] if r == 0 else carries[r]
        outs = out_node.args[0] if r == len(rows) - 1 else tuple(carries[r + 1])
        label = type(info.module).__name__ if info.module is not None else info.kind.capitalize()
        row = RowModule(root, _row_graph(ins, mine, outs, where, device, dead), class_name=f"{label}Row")
        row.autopar_inputs = tuple(torch.empty_like(v, device="meta") for v in _slot_values(ins))
        modules.append(row)
    names = ["embedding"] + [r.name.removeprefix("inner.") for r in rows[1:-1]] + ["head"]
    return CutRows(modules, [r.kind for r in rows], names)


_SHAPES_ONLY = [False]


@contextlib.contextmanager
def shapes_only():
    """Cuts made inside only to read shapes (``model_verdict``'s rewrite probe) keep a meta
    model's computed tensors as constants, as before factories were recorded: the rewrite of
    rotary blocks (Qwen3, Llama) is probed as it runs on a real model."""
    _SHAPES_ONLY[0] = True
    try:
        yield
    finally:
        _SHAPES_ONLY[0] = False


def _hidden_like(module, args, kwargs):
    """A block of a ``meta`` model whose code cannot run on meta (MoE experts' grouped matmul
    checks dtypes, routing needs values) is taken to return a tensor shaped like its hidden-state
    input: all the cut needs from it is what crosses the next cut."""
    try:
        with torch.no_grad():
            return module(*args, **kwargs)
    except Exception:  # noqa: BLE001 — only shapes are needed here
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        return None if first is None else torch.empty_like(first)


def _keep_logits_only(top: fx.GraphModule) -> None:
    """The graph's output reduced to the model's logits; what only fed the rest is removed."""
    out = next(n for n in top.graph.nodes if n.op == "output")
    picked = model_logits(out.args[0])
    while isinstance(picked, fx.Node) and not isinstance(picked.meta.get("val"), torch.Tensor):
        val = picked.meta.get("val")
        index = next((i for i, v in enumerate(val) if v is model_logits(val)), 0) \
            if isinstance(val, (tuple, list)) else None
        if index is None:
            raise TraceError("cannot tell which output of the model is its logits; return a tensor, "
                             "a tuple starting with the logits, or a dict with 'logits'")
        with top.graph.inserting_before(out):
            node = top.graph.call_function(operator.getitem, (picked, index))
        node.meta["val"] = val[index]
        picked = node
    out.args = (picked,)
    top.graph.eliminate_dead_code()


def _carry(nodes, row_of, cut: int) -> list[fx.Node]:
    """Values computed before row ``cut`` and used from it on (get_attr is re-read instead)."""
    return [n for n in nodes if row_of[n] < cut and n.op != "get_attr"
            and any(u.op == "output" or row_of.get(u, 0) >= cut for u in n.users)]


def _hidden_first(carry: list, rows, cut: int) -> list:
    """The hidden state first among what crosses a cut (the next block's first argument, or the
    last block's output before the head): the rewrite shards input 0 on the sequence under
    sequence parallel and keeps the others whole."""
    if 0 < cut < len(rows):
        nxt = rows[cut]
        primary = nxt.call_node.args[0] if nxt.kind == "block" and nxt.call_node.args else rows[cut - 1].call_node
        if primary in carry:
            return [primary] + [n for n in carry if n is not primary]
    return carry


def _slot_values(ins) -> list:
    """The traced values of a row's inputs, one per placeholder (a tuple's tensors each)."""
    out = []
    for n in ins:
        val = n.meta.get("val")
        out.extend(val if isinstance(val, (tuple, list)) else [val])
    return [v for v in out if isinstance(v, torch.Tensor)]


def _plain_call(call: fx.Node, mine, carry_in, carry_out) -> bool:
    """``x = block(x)``: the row is the block module itself."""
    return (mine == [call] and not call.kwargs and len(carry_in) == 1 and list(call.args) == carry_in
            and carry_out == [call] and isinstance(call.meta.get("val"), torch.Tensor))


def _dead_slots(n: fx.Node, row_of) -> frozenset:
    """The elements of a tuple crossing a cut that no later row reads: Falcon's last block returns
    ``(hidden, attention_probs)`` and the head reads ``[0]`` only. They do not cross (the
    attention probabilities are B·H·S² values, and selective recompute must free them)."""
    return dead_elements(n, [u for u in n.users if u.op == "output" or row_of.get(u, 0) > row_of[n]])


def _slots(n: fx.Node, dead=frozenset()) -> list | None:
    """How ``n`` crosses a cut: None for a tensor (itself); for a tuple, one entry per element —
    ``_TENSOR`` for a tensor (it crosses) or the constant itself (None, a number, a string: it
    does not cross, the other side puts it back). A block returning ``(hidden, None)``
    (DeBERTa-v2, Falcon) thus crosses as its one tensor, at any pipeline degree."""
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        return None
    if isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val) \
            and all(isinstance(v, torch.Tensor) or _constant(v) for v in val):
        return [None if i in dead else _TENSOR if isinstance(v, torch.Tensor) else v for i, v in enumerate(val)]
    raise TraceError(f"'{n.name}' ({n.format_node()}) crosses a row boundary but is "
                     f"{type(val).__name__}, not a tensor or a tuple of tensors (and constants); autopar "
                     "can pass only tensors between pipeline stages")


_TENSOR = object()


def _constant(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _row_graph(ins, mine, outs, where: str, traced: torch.device, dead=None) -> fx.Graph:
    g = fx.Graph()
    dead = dead or {}
    env: dict = {}
    for n in ins:
        k = _slots(n, dead.get(n, frozenset())) if n.op != "placeholder" else None
        if k is None:
            env[n] = g.placeholder(n.name)
            env[n].meta = dict(n.meta)
        else:
            env[n] = tuple(g.placeholder(f"{n.name}_{i}") if e is _TENSOR else e for i, e in enumerate(k))
    for n in mine:
        for a in n.all_input_nodes:
            if a not in env and a.op == "get_attr":
                env[a] = g.node_copy(a)
        if a_missing := [a for a in n.all_input_nodes if a not in env]:
            raise TraceError(f"{where}: '{n.name}' uses '{a_missing[0].name}' from another row")
        copied = g.node_copy(n, lambda a: env[a])
        env[n] = copied

    def out(n):
        v = env[n]
        k = _slots(n, dead.get(n, frozenset()))
        if isinstance(v, fx.Node) and k is not None:
            return tuple(g.call_function(operator.getitem, (v, i)) for i, e in enumerate(k) if e is _TENSOR)
        if isinstance(v, tuple):
            return tuple(e for e in v if isinstance(e, fx.Node))
        return (v,)

    if isinstance(outs, tuple):
        flat = tuple(x for n in outs for x in out(n))
        g.output(flat[0] if len(flat) == 1 else flat)   # one tensor crosses as itself
    else:
        g.output(env[outs])
    retarget_device(g, traced)
    g.lint()
    return g


def retarget_device(g: fx.Graph, traced: torch.device) -> None:
    """Arguments equal to the device the graph was traced on (``x.device`` read as a constant)
    become the device of the graph's first input, so the code runs wherever its input is."""
    first = next((n for n in g.nodes if n.op == "placeholder"), None)
    device = None
    for n in list(g.nodes):
        if first is None or n.op == "placeholder" or not _uses_device(n, traced):
            continue
        if device is None:
            with g.inserting_after(max((p for p in g.nodes if p.op == "placeholder"), key=_position(g))):
                device = g.call_function(getattr, (first, "device"))
        swap = _swap_device(traced, device)
        n.args, n.kwargs = map_aggregate(n.args, swap), map_aggregate(n.kwargs, swap)


def _position(g: fx.Graph):
    order = {n: i for i, n in enumerate(g.nodes)}
    return lambda n: order[n]


def _swap_device(traced: torch.device, node: fx.Node):
    return lambda v: node if _is(v, traced) else v


def _is(v, device: torch.device) -> bool:
    return isinstance(v, torch.device) and v == device


def _uses_device(n: fx.Node, device: torch.device) -> bool:
    found = []
    map_aggregate((n.args, n.kwargs), lambda v: found.append(v) if _is(v, device) else v)
    return bool(found)
