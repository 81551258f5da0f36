"""torch.fx plumbing the tensor-parallel rewrite stands on: tracing a row, running one node on
``meta`` values, and small predicates over nodes and module paths.

Kept apart from the rewrite passes so those read as the parallel layout they build, not as fx
bookkeeping; nothing here knows about tensor parallelism.
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.rewrite.node_source import where  # noqa: F401  (re-exported: the rewrite's modules import it from here)
from costmodels.contracts.errors import PlanError, TraceError


def drop_stale_fx_wraps() -> None:
    """torch.fx keeps a global table of ``torch.fx.wrap``-ed names per module globals. Code that
    fx generated for a graph holding a qualified wrapped call (e.g. ``_assert_is_none`` from
    ``concrete_args``) registers a dotted name its globals do not hold, and every later
    ``symbolic_trace`` in the process then fails with a KeyError. Drop such entries."""
    try:
        import builtins

        from torch.fx import _symbolic_trace as st
        table = st._wrapped_fns_to_patch
        for key, frame in list(table.items()):
            if key[1] not in frame and not hasattr(builtins, key[1]):
                del table[key]
    except Exception:  # noqa: BLE001 - private torch state; tracing reports its own errors
        pass


class _RowTracer(fx.Tracer):
    """fx's tracer, keeping ``nn.Linear`` subclasses that compute a plain linear whole (as the
    cut did: ``autopar.trace.linear_leaves``), so the rewrite shards them, and a MoE's routed
    experts whole (``rewrite/experts.py``)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        from autopar.rewrite.experts import is_expert_module  # a MoE's routed experts: one call
        from autopar.trace.linear_leaves import is_plain_linear
        return is_plain_linear(m) or is_expert_module(m) or super().is_leaf_module(m, qualname)


def trace_row(module: nn.Module, example: tuple | None = None) -> fx.GraphModule:
    """``module`` as a GraphModule (buffers proxied, stack traces kept for error messages).

    Plain ``torch.fx`` first (sizes stay symbolic); code it cannot trace — transformers layers
    that iterate over shapes, unpack ``*input_shape``, look attention functions up in a table —
    is traced again with the trace's shape-aware tracer on a ``meta`` copy for ``example``
    (:func:`trace_row_with_shapes`; sizes become literals, which the rewrite rewrites as well).
    A failure of both is one line naming the operation, the file and the line."""
    drop_stale_fx_wraps()
    tracer = _RowTracer()
    tracer.proxy_buffer_attributes = True
    tracer.record_stack_traces = True
    try:
        graph = tracer.trace(module)
    except Exception as e:  # noqa: BLE001 - report the user's line
        from autopar.trace.tracer import trace_error
        if example is None:
            raise trace_error(e, f"{type(module).__name__} with torch.fx for the rewrite") from None
        return trace_row_with_shapes(module, example)
    return fx.GraphModule(module, graph)


def trace_row_with_shapes(module: nn.Module, example: tuple) -> fx.GraphModule:
    """``module`` traced by ``autopar.trace``'s MetaTracer on a ``meta`` copy of itself for the
    serial input ``example``, re-rooted on ``module``; the device the trace saw becomes the
    input's device."""
    from autopar.rewrite.experts import expert_class_names, expert_meta_output
    from autopar.trace.cut import meta_copy, retarget_device
    from autopar.trace.driver import tracing_libraries
    from autopar.trace.tracer import trace_call
    ghost = meta_copy(module)
    try:
        with tracing_libraries():
            gm, _ = trace_call(ghost, tuple(meta_like(t) for t in example), {}, for_rewrite=True,
                               leaf_classes=("Conv1D",)   # GPT-2's linears: sharded as modules
                               + expert_class_names(ghost),   # a MoE's routed experts, whole
                               output_cache=expert_meta_output,
                               what=f"{type(module).__name__} for the rewrite")
    except TraceError as e:   # a leaf would not help here: the rewrite must see inside the block
        head = str(e).split("; mark that submodule as a leaf")[0]
        raise TraceError(f"{head}; tensor / sequence parallel and recompute rewrite the block's code, "
                         "which cannot run here: use tp=1, sequence_parallel=false, recompute='none' "
                         "(dp, pp and ZeRO run it as it is)") from None
    graph = gm.graph
    constants = {}
    for n in graph.nodes:
        if n.op in ("call_module", "get_attr"):
            if not n.target.startswith("inner."):   # renamed: the row may hold a '_tensor_constant0'
                value, n.target = _constant_of(gm, n, module), f"_rewrite_constant{len(constants)}"
                constants[n.target] = value
                continue
            n.target = n.target[len("inner."):]
    retarget_device(graph, torch.device("meta"))
    if not constants:
        return fx.GraphModule(module, graph)
    root = {n.target: constants[n.target] if n.target in constants else getattr_path(module, n.target)
            for n in graph.nodes if n.op in ("call_module", "get_attr")}
    out = fx.GraphModule(root, graph)
    for name in constants:   # made by the forward, not state: left out of the state dict
        out._non_persistent_buffers_set.add(name)
    return out


def _constant_of(gm: fx.GraphModule, n: fx.Node, module: nn.Module) -> torch.Tensor:
    """A tensor the forward made from constants (DeBERTa's ``torch.tensor(head_size)`` scale): its
    value, on the module's device; one computed from the weights (meta here) is refused."""
    t = getattr_path(gm, n.target) if n.op == "get_attr" else None
    if not isinstance(t, torch.Tensor) or t.is_meta:
        raise TraceError(f"cannot rewrite {type(module).__name__}: its forward creates a tensor "
                         f"from constants ('{n.name}'), which autopar cannot shard; register it "
                         "as a buffer in __init__")
    device = next((p.device for p in module.parameters()), t.device)
    return t if device.type == "meta" or t.dim() == 0 else t.to(device)


def meta_like(t):
    """A ``meta`` tensor of ``t``'s shape and dtype; anything else unchanged."""
    if isinstance(t, torch.Tensor):
        return torch.empty_like(t, device="meta")
    return t


def meta_call(mod: nn.Module, args, kwargs):
    """Call ``mod`` with its parameters and buffers on ``meta`` (no copy of real weights)."""
    if all(p.is_meta for p in mod.parameters()) and all(b.is_meta for b in mod.buffers()):
        return mod(*args, **kwargs)
    state = {n: meta_like(t) for n, t in list(mod.named_parameters()) + list(mod.named_buffers())}
    return torch.func.functional_call(mod, state, args, kwargs)


def eval_node(node: fx.Node, vals: dict, fetch_attr, fetch_module, fail):
    """The value of ``node`` (get_attr / call_*) given its inputs' values ``vals``, computed on
    ``meta``. Collective modules (those with a ``group``) run as they are: on meta or a FakeGroup
    they only reshape. An op that raises becomes ``fail(exception)`` (a TraceError naming the
    user's line); Plan/Trace errors pass through."""
    args = fx.node.map_arg(node.args, lambda a: vals[a])
    kwargs = fx.node.map_arg(node.kwargs, lambda a: vals[a])
    try:
        with torch.no_grad():
            if node.op == "get_attr":
                return meta_like(fetch_attr(node.target))
            if node.op == "call_function":
                return node.target(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            if node.op == "call_module":
                mod = fetch_module(node.target)
                if hasattr(mod, "group"):
                    return mod(*args, **kwargs)
                from autopar.rewrite.experts import expert_meta_output
                out = expert_meta_output(mod, args, kwargs)   # routed experts: data-dependent
                return out if out is not None else meta_call(mod, args, kwargs)
    except (PlanError, TraceError):
        raise
    except Exception as e:  # noqa: BLE001 - reported with the user's line
        raise fail(e) from None
    raise AssertionError(node.op)


def serial_values(traced: fx.GraphModule, example: tuple, fail) -> dict:
    """{node: value} of the serial row on ``meta`` for the serial ``example`` inputs (placeholders
    past the example take their default)."""
    full: dict[fx.Node, object] = {}
    phs = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for n in traced.graph.nodes:
        if n.op == "placeholder":
            i = phs.index(n)
            full[n] = meta_like(example[i]) if i < len(example) else (n.args[0] if n.args else None)
        elif n.op == "output":
            full[n] = fx.node.map_arg(n.args[0], lambda a: full[a])
        else:
            full[n] = eval_node(n, full, lambda path: getattr_path(traced, path), traced.get_submodule,
                                lambda e, n=n: fail(n, e))
    return full


def is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def tensor_like(v) -> bool:
    """A tensor or a non-empty tuple/list of tensors (the parts of a split)."""
    return is_tensor(v) or (isinstance(v, (tuple, list)) and v and all(is_tensor(x) for x in v))


def is_size_node(n: fx.Node) -> bool:
    """``x.size()`` / ``x.dim()`` / ``x.shape`` / ``x.ndim``: reads a shape, carries no data."""
    return ((n.op == "call_method" and n.target in ("size", "dim")) or
            (n.op == "call_function" and n.target is getattr and len(n.args) > 1
             and n.args[1] in ("shape", "ndim")))


def divisors(n: int) -> str:
    """'{1, 2, ...}': the tp values a size allows, for error messages."""
    return "{" + ", ".join(str(d) for d in range(1, n + 1) if n % d == 0) + "}"


def getattr_path(obj, path: str):
    for p in path.split("."):
        obj = getattr(obj, p)
    return obj


def owner_of(root: nn.Module, path: str):
    """(module holding ``path``'s tensor, its leaf name), or (None, leaf) if there is none."""
    owner, _, leaf = path.rpartition(".")
    try:
        return (root.get_submodule(owner) if owner else root), leaf
    except AttributeError:
        return None, leaf


def is_nonpersistent(root: nn.Module, path: str) -> bool:
    mod, leaf = owner_of(root, path)
    return mod is not None and leaf in getattr(mod, "_non_persistent_buffers_set", ())


def has_tensor(root: nn.Module, path: str) -> bool:
    mod, leaf = owner_of(root, path)
    return mod is not None and (leaf in mod._parameters or leaf in mod._buffers)
