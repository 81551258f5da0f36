"""A torch.fx tracer that knows every value's shape (meta propagation).

Plain ``torch.fx.symbolic_trace`` fails on ordinary model code such as
``B, H, T, D = x.shape`` or ``if x.size(1) > 1``, because a Proxy has no shape. This tracer runs
every recorded operation on ``meta`` tensors as it records it (``node.meta["val"]``), so shape,
dtype and device queries return concrete values and the graph is specialised to the traced
shapes, exactly what a cost measurement needs. Control flow on tensor *values* (``if x.max() >
0``) still cannot be traced; :func:`trace_error` turns such failures into a one-line
:class:`TraceError` naming the operation, its source line, and the module to mark as a leaf.

Leaf modules (recorded as one ``call_module`` node and run as a whole) are torch.nn's own
modules, classes named by the user (``--leaf ClassName``) and, at the top level, the repeated
blocks (each block is traced on its own, once per structurally identical group).
"""
from __future__ import annotations

import contextlib
import linecache
import os
import traceback

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.node import map_arg
from torch.utils import _pytree as pytree

from autopar.trace.linear_leaves import is_plain_linear
from autopar.trace.meta_moves import recorded_moves
from costmodels.contracts.errors import TraceError

# methods / attributes that return plain Python values computed from the meta value
_CONCRETE_METHODS = {"size", "dim", "numel", "nelement", "is_floating_point", "is_complex",
                     "element_size", "get_device", "is_contiguous", "stride", "ndimension"}
_CONCRETE_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "is_meta", "layout",
                   "is_sparse", "is_quantized", "is_nested"}
_CONCRETE_FUNCTIONS = {torch.is_floating_point, torch.numel, torch.is_complex}


class MetaProxy(fx.Proxy):
    """A Proxy whose node carries the meta value it stands for."""

    def __getattr__(self, k: str):
        if k in _CONCRETE_ATTRS:
            meta = self.node.meta.get("val")
            if isinstance(meta, torch.Tensor):
                return getattr(meta, k)
        return super().__getattr__(k)

    def __len__(self) -> int:
        meta = self.node.meta.get("val")
        if meta is None:
            return super().__len__()
        return len(meta)

    def __iter__(self):
        meta = self.node.meta.get("val")
        if isinstance(meta, (torch.Tensor, tuple, list)):
            return iter([self[i] for i in range(len(meta))])
        return super().__iter__()


class MetaTracer(fx.Tracer):
    """fx Tracer with meta propagation; see the module docstring."""

    def __init__(self, leaf_classes=(), leaf_modules=(), output_cache=None):
        super().__init__(autowrap_functions=())
        self.leaf_classes = tuple(leaf_classes)   # class names or classes
        self.leaf_modules = {id(m) for m in leaf_modules}
        self.placeholder_values: list = []
        # id(module) -> callable(args, kwargs) -> meta output or None (for repeated blocks)
        self.output_cache = output_cache
        self._concrete = 0   # > 0 while running real (meta) computations during tracing

    def call_module(self, m, forward, args, kwargs):
        if self._concrete or self._stateless_stranger(m):
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def _stateless_stranger(self, m: nn.Module) -> bool:
        """A module called in the forward but not installed in the model (RoBERTa's head calls a
        module-level ``gelu = GELUActivation()``): with no parameters or buffers it is just code,
        traced through; one holding state still fails (fx's 'not installed as a submodule')."""
        try:
            self.path_of_module(m)
            return False
        except NameError:
            return next(iter(m.parameters()), None) is None and next(iter(m.buffers()), None) is None

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if self._concrete:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    # --- leaves -------------------------------------------------------------------------
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if id(m) in self.leaf_modules or is_plain_linear(m):   # FalconLinear: linear_leaves
            return True
        for c in self.leaf_classes:
            if (isinstance(c, str) and type(m).__name__ == c) or (isinstance(c, type) and isinstance(m, c)):
                return True
        return super().is_leaf_module(m, qualname)

    # --- proxies carry meta values -----------------------------------------------------
    def proxy(self, node: fx.Node) -> fx.Proxy:
        return MetaProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        if kind == "call_method" and target in _CONCRETE_METHODS and isinstance(args[0], fx.Proxy):
            a, k = self._metas(args, kwargs)
            if isinstance(a[0], torch.Tensor):
                return getattr(a[0], target)(*a[1:], **k)
        if kind == "call_function" and target in _CONCRETE_FUNCTIONS:
            a, k = self._metas(args, kwargs)
            return target(*a, **k)
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        node = proxy.node
        if kind == "placeholder":
            node.meta["val"] = self.placeholder_values.pop(0) if self.placeholder_values else None
        elif kind != "output":
            node.meta["val"] = self._run(node)
        return proxy

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if kind == "get_attr":
            try:
                node.meta["val"] = self._run(node)
            except AttributeError:
                pass
        return node

    def _metas(self, args, kwargs):
        def conv(x):
            if isinstance(x, fx.Proxy):
                return x.node.meta.get("val")
            return x
        return pytree.tree_map(conv, tuple(args)), pytree.tree_map(conv, dict(kwargs))

    def _run(self, node: fx.Node):
        args = map_arg(node.args, lambda n: n.meta.get("val"))
        kwargs = map_arg(node.kwargs, lambda n: n.meta.get("val"))
        self._concrete += 1
        try:
            return self._run_concrete(node, args, kwargs)
        finally:
            self._concrete -= 1

    def _run_concrete(self, node, args, kwargs):
        with torch.no_grad():
            if node.op == "get_attr":
                obj = self.root
                for part in node.target.split("."):
                    obj = getattr(obj, part)
                return obj
            if node.op == "call_function":
                return node.target(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            if node.op == "call_module":
                mod = self.root.get_submodule(node.target)
                if self.output_cache is not None:
                    cached = self.output_cache(mod, args, kwargs)
                    if cached is not None:
                        return cached
                return mod(*args, **kwargs)
        return None

    def to_bool(self, obj: fx.Proxy) -> bool:
        meta = obj.node.meta.get("val")
        if meta is not None and not isinstance(meta, torch.Tensor):
            return bool(meta)
        return super().to_bool(obj)

    def iter(self, obj: fx.Proxy):
        meta = obj.node.meta.get("val")
        if isinstance(meta, (tuple, list, torch.Tensor)):
            return iter([obj[i] for i in range(len(meta))])
        return super().iter(obj)

    def keys(self, obj: fx.Proxy):
        meta = obj.node.meta.get("val")
        if isinstance(meta, dict):
            return list(meta.keys())
        return super().keys(obj)


class CallWrapper(nn.Module):
    """Calls ``inner(*args, **kwargs)`` with the tensors of (args, kwargs) as positional inputs,
    so that any call signature (keyword arguments, tuples, constants) traces with one
    placeholder per tensor."""

    def __init__(self, inner: nn.Module, args: tuple, kwargs: dict):
        super().__init__()
        self.inner = inner
        leaves, self._spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        self._is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
        self._consts = [None if t else x for x, t in zip(leaves, self._is_tensor)]
        self.n_inputs = sum(self._is_tensor)

    @staticmethod
    def tensors_of(args: tuple, kwargs: dict) -> list:
        leaves, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
        return [x for x in leaves if isinstance(x, torch.Tensor)]

    def invoke(self, *tensors):
        it = iter(tensors)
        leaves = [next(it) if t else c for t, c in zip(self._is_tensor, self._consts)]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        return self.inner(*args, **kwargs)

    def forward(self, *tensors):  # replaced per instance by trace_call's generated signature
        return self.invoke(*tensors)


def trace_call(module: nn.Module, args: tuple, kwargs: dict, *, leaf_classes=(), leaf_modules=(),
               output_cache=None, what: str = "model",
               for_rewrite: bool = False, record_factories: bool = False) -> tuple[fx.GraphModule, CallWrapper]:
    """Trace ``module(*args, **kwargs)`` (meta args) into a GraphModule whose placeholders are
    the tensors of (args, kwargs) in pytree order. Raises TraceError on failure.
    ``for_rewrite``: buffers read in the forward stay ``get_attr`` nodes (else constants) and
    nodes keep their source line, for the rewrite's error messages. ``record_factories`` (implied
    by ``for_rewrite``): tensor factories stay graph nodes (``recorded_factories``)."""
    n_inputs = len(CallWrapper.tensors_of(args, kwargs))
    names = [f"in{i}" for i in range(n_inputs)]
    src = f"def forward(self, {', '.join(names)}):\n    return self.invoke({', '.join(names)})\n"
    ns: dict = {}
    exec(src, ns)  # noqa: S102 — a fixed signature with one name per tensor input
    cls = type("CallWrapper", (CallWrapper,), {"forward": ns["forward"]})
    wrapper = cls(module, args, kwargs)
    tracer = MetaTracer(leaf_classes, leaf_modules, output_cache)
    tracer.proxy_buffer_attributes = tracer.record_stack_traces = for_rewrite
    tracer.placeholder_values = CallWrapper.tensors_of(args, kwargs)
    try:
        with recorded_factories(tracer) if for_rewrite or record_factories else contextlib.nullcontext(), \
                recorded_moves(tracer) if record_factories else contextlib.nullcontext():   # meta_moves
            graph = tracer.trace(wrapper)
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001 — translated into one line for the user
        raise trace_error(e, what) from None
    gm = fx.GraphModule(wrapper, graph)
    gm.meta["tracer_leaf_classes"] = tuple(leaf_classes)
    return gm, wrapper


_OWN_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
_FACTORIES = ("ones", "zeros", "full", "empty", "arange", "eye")


@contextlib.contextmanager
def recorded_factories(tracer: MetaTracer):
    """``torch.ones(T, T, device=x.device)`` and the other tensor factories recorded as graph
    nodes instead of run into constants: a mask built in a block's forward stays code the
    rewrite can run on the shard (a constant traced on ``meta`` would have no values)."""
    saved = {name: getattr(torch, name) for name in _FACTORIES}

    def recording(fn):
        def factory(*args, **kwargs):
            if tracer._concrete:
                return fn(*args, **kwargs)
            return tracer.create_proxy("call_function", fn, args, kwargs)
        return factory

    for name, fn in saved.items():
        setattr(torch, name, recording(fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)


def _is_library_file(filename: str) -> bool:
    f = os.path.abspath(filename)
    if any(f.startswith(d + os.sep) for d in _OWN_DIRS):
        return True
    return f.startswith("<")


def trace_error(e: BaseException, what: str) -> TraceError:
    """Turn an exception raised while tracing into a one-line TraceError that names the
    operation, the user's source line, and the module class to mark as a leaf."""
    tb = traceback.extract_tb(e.__traceback__)
    frames = []
    t = e.__traceback__
    while t is not None:
        frames.append(t.tb_frame)
        t = t.tb_next
    user = None
    module_cls = None
    for fs, frame in zip(tb, frames):
        if _is_library_file(fs.filename):
            continue
        user = fs
        code = frame.f_code
        self_obj = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if isinstance(self_obj, nn.Module) and not isinstance(self_obj, CallWrapper):
            module_cls = type(self_obj).__name__
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    value_dependent = False
    if "control flow" in msg:
        op = "control flow on a tensor's value (an if/while/and/or that needs the data)"
        value_dependent = True
    elif "cannot be iterated" in msg:
        op = "iteration over a tensor whose length is unknown"
    elif "Proxy" in msg:
        op = f"a call that cannot take a traced value ({type(e).__name__}: {msg})"
    elif "item()" in msg or "meta tensors" in msg or "data-dependent" in msg.lower() or "nonzero" in msg:
        op = f"a data-dependent operation ({msg})"
        value_dependent = True
    else:
        op = f"{type(e).__name__}: {msg}"
    where = ""
    if user is not None:
        code = (user.line or linecache.getline(user.filename, user.lineno) or "").strip()
        where = f" at {user.filename}:{user.lineno} `{code}`"
    if value_dependent:
        # a leaf would not help: autopar measures on meta tensors, which hold no values
        fix = ("autopar measures on meta tensors, which hold no values: make that line independent of "
               "tensor values (e.g. torch.where or a mask instead of an if, a fixed size instead of nonzero)")
    elif module_cls:
        fix = (f"mark that submodule as a leaf with --leaf {module_cls} (leaf_modules=('{module_cls}',) "
               "in Python) so autopar runs it whole, or rewrite that line")
    else:
        fix = "rewrite that line so that torch.fx can trace it"
    return TraceError(f"cannot trace {what}: {op}{where}; {fix}")
