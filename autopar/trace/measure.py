"""Run a traced graph on meta tensors and measure every node: FLOPs, saved activations, outputs.

One forward and one backward pass on ``meta`` tensors (no data, no weight memory) with

* ``torch.utils.flop_counter.FlopCounterMode`` counting FLOPs (matmuls, convolutions, fused
  attention) and attributing them to the fx node running at the time; in the backward pass the
  "node running" is known from a pre-hook on every autograd node, tagged in the forward pass
  with the fx node that created it;
* ``torch.autograd.graph.saved_tensors_hooks`` recording each tensor autograd saves for
  backward (parameters and buffers excluded), keyed by its storage so that a tensor saved by
  two operations counts once, and remembering which fx node created that storage — this is what
  splits saved bytes into tensor-parallel regions and the attention core.

A *tag* is ``(row_index, node_name)``.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

Tag = tuple  # (row_index, node_name)

_aten = torch.ops.aten
_MM = {_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten.convolution}
_WEIGHTED = _MM | {_aten._grouped_mm}   # products whose weight operand gets a gradient


def storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 — tensors without a storage (wrapped numbers, subclasses)
        return ("id", id(t))


def storage_nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001
        return int(t.numel() * t.element_size())


def tensor_bytes(value) -> int:
    """Bytes of all tensors in a (nested) value, each distinct storage once."""
    seen, total = set(), 0
    for x in pytree.tree_leaves(value):
        if isinstance(x, torch.Tensor):
            k = storage_key(x)
            if k not in seen:
                seen.add(k)
                total += int(x.numel() * x.element_size())
    return total


@dataclass
class SavedRecord:
    tag: Tag          # the node that saved it (consumer)
    key: Any          # storage key
    nbytes: int
    creator: Tag | None  # the node whose output holds the storage (None: created inside `tag`)


@dataclass
class Recorder:
    param_keys: set
    weight_keys: set = field(default_factory=set)   # storages of parameters that train (dW counted)
    tag: Tag = (0, "")
    phase: str = "fwd"
    fwd_flops: dict = field(default_factory=dict)
    bwd_flops: dict = field(default_factory=dict)
    wgt_flops: dict = field(default_factory=dict)   # tag -> the backward's weight-gradient FLOPs
    matmuls: dict = field(default_factory=dict)     # tag -> [(m, n, k), ...] forward only
    out_bytes: dict = field(default_factory=dict)   # tag -> bytes of the node's output
    creator: dict = field(default_factory=dict)     # storage key -> tag
    saved: list = field(default_factory=list)
    keep: list = field(default_factory=list)        # keeps storages alive so keys stay unique
    _tagged: set = field(default_factory=set)
    _fns: list = field(default_factory=list)

    # --- FLOPs --------------------------------------------------------------------------
    def add_flops(self, n: int) -> None:
        d = self.fwd_flops if self.phase == "fwd" else self.bwd_flops
        d[self.tag] = d.get(self.tag, 0) + n

    def add_weight_grad_flops(self, n: int, args) -> None:
        """A forward matmul (mm, addmm, bmm, convolution, grouped mm) with a trainable parameter
        as an operand: its weight gradient (dW = dYᵀ·X, or the convolution's) costs the same FLOPs
        as the forward product, so the backward's weight-gradient share grows by ``n``; a matmul
        of two activations (attention's Q·Kᵀ, scores·V) has none (all its backward is B)."""
        if self.weight_keys and any(isinstance(a, torch.Tensor) and storage_key(a) in self.weight_keys
                                    for a in args):
            self.wgt_flops[self.tag] = self.wgt_flops.get(self.tag, 0) + n

    def add_matmul(self, func, args, out) -> None:
        try:
            if func is _aten.mm:
                (m, k), n = args[0].shape, args[1].shape[1]
            elif func is _aten.addmm:
                (m, k), n = args[1].shape, args[2].shape[1]
            elif func in (_aten.bmm, _aten.baddbmm):
                a, b = (args[0], args[1]) if func is _aten.bmm else (args[1], args[2])
                m, k, n = a.shape[0] * a.shape[1], a.shape[2], b.shape[2]
            elif func is _aten.convolution:  # as im2col: (N·out pixels) x Cout x (Cin/groups·kernel)
                w = args[1]
                m = math.prod(out.shape[:1]) * math.prod(out.shape[2:])
                n = w.shape[0]
                k = math.prod(w.shape[1:])
            else:
                return
        except Exception:  # noqa: BLE001
            return
        self.matmuls.setdefault(self.tag, []).append((int(m), int(n), int(k)))

    # --- saved tensors --------------------------------------------------------------------
    def pack(self, t):
        if self.phase == "fwd" and isinstance(t, torch.Tensor):
            key = storage_key(t)
            if key not in self.param_keys:
                self.saved.append(SavedRecord(self.tag, key, storage_nbytes(t), self.creator.get(key)))
                self.keep.append(t)
        return t

    @staticmethod
    def unpack(t):
        return t

    # --- node outputs -----------------------------------------------------------------------
    def after_node(self, tag: Tag, out) -> None:
        leaves = [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
        self.out_bytes[tag] = tensor_bytes(leaves)
        for x in leaves:
            self.creator.setdefault(storage_key(x), tag)
            if x.grad_fn is not None:
                self._tag_grad_fns(x.grad_fn, tag)
        self.keep.append(leaves)

    def _tag_grad_fns(self, fn, tag: Tag) -> None:
        stack = [fn]
        while stack:
            f = stack.pop()
            if f is None or id(f) in self._tagged:
                continue
            self._tagged.add(id(f))
            self._fns.append(f)
            try:
                f.register_prehook(self._bwd_setter(tag))
            except Exception:  # noqa: BLE001 — AccumulateGrad etc. without prehooks
                pass
            stack.extend(nf for nf, _ in f.next_functions)

    def _bwd_setter(self, tag: Tag) -> Callable:
        def hook(grad_outputs):
            self.tag = tag
        return hook

    def resolved_saved(self) -> list[SavedRecord]:
        """Saved records with their creator filled in: a storage unknown when it was saved was
        created by the saving node itself (as its output or internally)."""
        out = []
        for r in self.saved:
            c = r.creator if r.creator is not None else self.creator.get(r.key, r.tag)
            if r.creator is None and c != r.tag:
                c = r.tag
            out.append(SavedRecord(r.tag, r.key, r.nbytes, c))
        return out

    def internal(self, r: SavedRecord) -> bool:
        """True when the saved storage was created inside its creator node, not as its output."""
        return self.creator.get(r.key) != r.creator


def grouped_mm_flops(a, b, *args, out_val=None, **kwargs) -> int:
    """FLOPs of ``torch._grouped_mm`` (MoE experts in transformers, torchtitan), which torch's
    FlopCounterMode does not count: every row of ``a`` meets one group's matrix, so the count
    does not depend on the routing (``offs``), and a leaf run whole on ``meta`` is priced
    exactly. Layouts: (M, K)·(G, K, N), (G, M, K)·(K, N), (G, M, K)·(G, K, N), (K, M)·(M, N)."""
    if a.dim() == 2 and b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    if a.dim() == 3 and b.dim() == 2:
        return 2 * a.shape[1] * a.shape[2] * b.shape[1]
    if a.dim() == 3 and b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    return 2 * a.shape[0] * a.shape[1] * b.shape[-1]


class Counter(FlopCounterMode):
    """FlopCounterMode that attributes each counted op to the recorder's current tag."""

    def __init__(self, rec: Recorder):
        super().__init__(display=False)
        self.rec = rec
        self.mod_tracker = contextlib.nullcontext()  # per-module attribution is ours
        self.flop_registry = {**self.flop_registry, torch.ops.aten._grouped_mm: grouped_mm_flops}

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet in self.flop_registry:
            n = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
            self.rec.add_flops(n)
            if self.rec.phase == "fwd" and func_packet in _MM:
                self.rec.add_matmul(func_packet, args, out)
            if self.rec.phase == "fwd" and func_packet in _WEIGHTED:
                self.rec.add_weight_grad_flops(n, args)
        return out


class TagInterpreter(fx.Interpreter):
    """Runs a GraphModule, telling the recorder which node runs; ``call_block`` handles the
    call_module nodes of repeated blocks."""

    def __init__(self, gm: fx.GraphModule, rec: Recorder, tag_of: Callable[[fx.Node], Tag],
                 call_block: Callable | None = None):
        super().__init__(gm, garbage_collect_values=False)
        self.rec = rec
        self.tag_of = tag_of
        self.call_block = call_block

    def run_node(self, n: fx.Node):
        tag = self.tag_of(n)
        self.rec.tag = tag
        if n.op == "call_module" and self.call_block is not None:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            out = self.call_block(n, args, kwargs)
            if out is NotImplemented:
                self.rec.tag = tag
                out = super().run_node(n)
        else:
            out = super().run_node(n)
        self.rec.tag = tag
        if n.op != "output":
            self.rec.after_node(tag, out)
        return out


class CudaDropout(TorchFunctionMode):
    """Dropout as it runs on a GPU: ``native_dropout`` with a 1-byte mask. (On CPU and meta
    tensors ``F.dropout`` falls back to multiplying by a noise tensor of the input's dtype,
    which would overstate the saved mask by the dtype's size.)"""

    _FUNCS = {F.dropout, torch.dropout, torch.nn.functional.dropout}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._FUNCS:
            x = args[0] if args else kwargs.get("input")
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            train = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
            inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
            if isinstance(x, torch.Tensor) and train and 0.0 < float(p) < 1.0 and not inplace:
                return torch.native_dropout(x, float(p), True)[0]
        return func(*args, **kwargs)


class Replay(torch.autograd.Function):
    """Stands in for a block structurally identical to one already measured: returns fresh
    tensors shaped like that block's output, keeps the autograd chain, computes nothing."""

    @staticmethod
    def forward(ctx, make_outputs, *inputs):
        ctx.specs = [(x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else None for x in inputs]
        return tuple(make_outputs())

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + tuple(torch.zeros(s[0], dtype=s[1], device=s[2]) if s is not None else None
                               for s in ctx.specs)


def empty_like_tree(value):
    """Fresh meta tensors with the shapes of ``value``'s tensors (same nesting)."""
    return pytree.tree_map(lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta")
                           if isinstance(x, torch.Tensor) else x, value)


def replay(template, inputs: list):
    """Replay a block: outputs shaped like ``template``, differentiable w.r.t. ``inputs``."""
    leaves, spec = pytree.tree_flatten(template)
    tensor_idx = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def make():
        return [torch.empty(leaves[i].shape, dtype=leaves[i].dtype, device="meta") for i in tensor_idx]

    grad_inputs = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if grad_inputs:
        outs = Replay.apply(make, *grad_inputs)
    else:
        outs = make()
    new = list(leaves)
    for i, t in zip(tensor_idx, outs):
        if not t.is_floating_point() and t.requires_grad:
            t = t.detach()
        new[i] = t
    return pytree.tree_unflatten(new, spec)
