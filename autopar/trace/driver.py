"""Trace a model into a LayerTable (and a networkx graph of every node): the driver.

Steps (all on ``meta`` tensors, bf16, training mode, math attention):

1. Build the model and find its repeated blocks: the largest ``nn.ModuleList`` of same-class
   modules (``blocks`` for the presets, ``transformer.h`` for nanoGPT, ``model.layers`` for
   transformers models). Blocks are grouped by structure (module types, simple attributes,
   parameter and buffer shapes); only the first block of each group is measured, the others
   get copies of its row — this is what makes ``llama3-405b`` take seconds
   (``autopar.trace.blocks``).
2. Trace the top level with torch.fx (blocks as leaves, ``autopar.trace.tracer``), then each
   group's first block. What runs before the first block is the ``embedding`` row, what runs
   after the last is the ``head`` row (for the presets these are exactly the ``embedding`` and
   ``head`` modules).
3. Run forward and backward once under FlopCounterMode and saved-tensor hooks
   (``autopar.trace.measure``), then add up per row, find tensor-parallel pairs
   (``autopar.trace.tp``) and classify saved bytes (``autopar.trace.table``).
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import sys
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from autopar.models.outputs import forward_kwargs
from autopar.trace.batch_norm import eval_batch_norms
from autopar.trace.blocks import (
    RowInfo,
    assign_rows,
    block_modules,
    call_values,
    find_block_list,
    structure_groups,
    value_sig,
)
from autopar.trace.experts import expert_leaf_classes
from autopar.trace.measure import Counter, CudaDropout, Recorder, TagInterpreter, empty_like_tree, replay, storage_key
from autopar.trace.result import TraceResult
from autopar.trace.table import build_table
from autopar.trace.tracer import CallWrapper, trace_call, trace_error
from costmodels.contracts.checks import limit, quote
from costmodels.contracts.errors import TraceError
from costmodels.contracts.layer_table import LayerTable

ACT_DTYPE = torch.bfloat16

__all__ = ["ACT_DTYPE", "RowInfo", "TraceResult", "find_block_list", "table_for", "trace_graph", "trace_model"]


def _leaf_classes(leaf_modules) -> tuple:
    """Class names (a string may hold several, comma-separated) or classes to trace as leaves."""
    out = []
    for c in leaf_modules or ():
        if isinstance(c, str):
            out.extend(s.strip() for s in c.split(",") if s.strip())
        else:
            out.append(c)
    return tuple(out)


leaf_classes = _leaf_classes   # the one reading of --leaf, for the runtime's row cutter too


def _check_leaf_names(model: nn.Module, leaf_classes) -> None:
    names = {type(m).__name__ for m in model.modules()}
    for c in leaf_classes:
        if isinstance(c, str) and c not in names:
            close = difflib.get_close_matches(c, sorted(names), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise TraceError(f"--leaf {c}: the model has no submodule of class '{c}'; {hint}"
                             f"classes in this model: {', '.join(sorted(names)[:12])}")


def trace_graph(source, micro_batch: int = 1, leaf_modules=()) -> TraceResult:
    """Trace ``source`` (a ModelSource) for one micro-batch; see the module docstring."""
    with tracing_libraries():
        return _trace_graph(source, micro_batch, leaf_modules)


@contextlib.contextmanager
def tracing_libraries():
    """Tell transformers it is being traced, so that it skips data-dependent checks (e.g.
    packed-sequence detection) that cannot run on meta tensors."""
    patched = []
    iu = sys.modules.get("transformers.utils.import_utils")
    orig = getattr(iu, "is_tracing", None)
    if orig is not None:
        for name, mod in list(sys.modules.items()):
            if name.startswith("transformers") and getattr(mod, "is_tracing", None) is orig:
                mod.is_tracing = lambda *a, **k: True
                patched.append(mod)
    try:
        yield
    finally:
        for mod in patched:
            mod.is_tracing = orig


@contextlib.contextmanager
def cache_off(model: nn.Module):
    """A transformers model's key/value cache switched off for the duration (training keeps
    none, and a cache object cannot cross the rows)."""
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    if use_cache is not None:
        config.use_cache = False
    try:
        yield
    finally:
        if use_cache is not None:
            config.use_cache = use_cache


def _trace_graph(source, micro_batch: int, leaf_modules) -> TraceResult:
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise TraceError(f"micro-batch must be an integer >= 1 (got {quote(micro_batch)})")
    limit("micro_batch", micro_batch, TraceError, what="micro-batch")
    limit("seq", int(getattr(source, "seq", 1) or 1), TraceError, what="sequence length")
    spec = getattr(source, "spec", "model")
    leaf_classes = _leaf_classes(leaf_modules)
    model = source.build("meta", seed=None, attention="math", dtype=ACT_DTYPE)
    model.train()
    eval_batch_norms(model)   # a throwaway meta model: BatchNorm in eval mode for the trace
    _check_leaf_names(model, leaf_classes)
    leaf_classes += tuple(c for c in expert_leaf_classes(model) if c not in leaf_classes)   # MoE
    inputs = tuple(source.example_inputs(micro_batch, "meta"))
    inputs = tuple(x.to(ACT_DTYPE) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs)

    found = find_block_list(model)
    blocks = block_modules(found[1]) if found else []
    limit("layers", len(blocks), TraceError, what=f"{spec}: repeated blocks")
    block_ids = {id(b): i for i, b in enumerate(blocks)}
    group_of = structure_groups(blocks)

    # while tracing the top level, a block whose group already ran on the same input signature
    # is not run again: it returns empty tensors shaped like that run's output
    out_cache: dict[tuple, Any] = {}

    def output_cache(mod, args, kwargs):
        i = block_ids.get(id(mod))
        if i is None:
            return None
        key = (group_of[i], value_sig((args, kwargs)))
        if key in out_cache:
            return empty_like_tree(out_cache[key])
        with torch.no_grad():
            out = mod(*args, **kwargs)
        out_cache[key] = out
        return out

    top_kwargs = forward_kwargs(model, inputs)   # nanoGPT's targets: full-sequence logits, as trained
    with cache_off(model):
        top, _ = trace_call(model, inputs, top_kwargs, leaf_classes=leaf_classes,
                            leaf_modules=blocks, output_cache=output_cache, what=spec)
    rows, node_row = assign_rows(top, blocks, group_of)

    # trace each group's measured block
    block_gms: dict[int, fx.GraphModule] = {}
    for r, info in enumerate(rows):
        if info.kind == "block" and info.rep == r:
            args, kwargs = call_values(info.call_node)
            block_gms[r], _ = trace_call(info.module, args, kwargs, leaf_classes=leaf_classes,
                                         what=f"{spec} ({info.name})")

    # measure: one forward and backward, measured blocks run node by node, the others replayed
    rec = Recorder(param_keys={storage_key(t) for t in list(model.parameters()) + list(model.buffers())},
                   weight_keys={storage_key(t) for t in model.parameters() if t.requires_grad})
    row_of_node = {n: node_row[n.name] for n in top.graph.nodes}
    call_row = {info.call_node: r for r, info in enumerate(rows) if info.kind == "block"}

    def call_block(n, args, kwargs):
        r = call_row.get(n)
        if r is None:
            return NotImplemented
        tensors = CallWrapper.tensors_of(args, kwargs)
        if rows[r].rep == r:
            out = TagInterpreter(block_gms[r], rec, lambda m, r=r: (r, m.name)).run(*tensors)
            rec.tag = (r, n.name)
            return out
        return replay(n.meta.get("val"), tensors)

    top_interp = TagInterpreter(top, rec, lambda n: (row_of_node[n], n.name), call_block)
    try:
        with Counter(rec), CudaDropout(), torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
            out = top_interp.run(*CallWrapper.tensors_of(inputs, top_kwargs))
        outs = [x for x in pytree.tree_leaves(out)
                if isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()]
        rec.phase = "bwd"
        if outs:
            with Counter(rec):
                torch.autograd.backward(outs, [torch.ones_like(x) for x in outs])
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001 — e.g. a leaf module whose code needs tensor values
        raise trace_error(e, spec) from None
    for p in model.parameters():
        p.grad = None

    result = TraceResult(table=None, model=model, top=top, blocks=block_gms, rows=rows,
                         node_row=node_row, rec=rec)
    result.table = build_table(source, spec, micro_batch, result, ACT_DTYPE)
    return result


def trace_model(source, micro_batch: int = 1, leaf_modules=()) -> LayerTable:
    """The LayerTable of ``source`` for one micro-batch of ``micro_batch`` sequences."""
    return trace_graph(source, micro_batch, leaf_modules).table


# 512, not 32: one validation sweep (benchmarks/bench_costmodels_validation.open_results) asks for
# 74 distinct tables and re-traced 39 of them at 32; a table is ~15-20 kB of frozen rows (9 MB at most)
@functools.lru_cache(maxsize=512)
def _table_cached(spec: str, micro_batch: int, seq: int | None, leaf_modules: tuple) -> LayerTable:
    from autopar.models import load_model
    from autopar.trace.disk_cache import cached_trace  # moespeed: built-in models' tables on disk
    return cached_trace(spec, micro_batch, seq, leaf_modules,
                        lambda: trace_model(load_model(spec, seq=seq), micro_batch, leaf_modules))


def table_for(spec: str, micro_batch: int = 1, seq: int | None = None, leaf_modules=()) -> LayerTable:
    """Cached ``trace_model(load_model(spec, seq), micro_batch)``."""
    return _table_cached(spec, int(micro_batch), None if seq is None else int(seq), tuple(leaf_modules))
