"""Trace a model into a LayerTable (and a networkx graph of every node).

Steps (all on ``meta`` tensors, bf16, training mode, math attention):

1. Build the model and find its repeated blocks: the largest ``nn.ModuleList`` of same-class
   modules (``blocks`` for the presets, ``transformer.h`` for nanoGPT, ``model.layers`` for
   transformers models). Blocks are grouped by structure (module types, simple attributes,
   parameter and buffer shapes); only the first block of each group is measured, the others
   get copies of its row — this is what makes ``llama3-405b`` take seconds.
2. Trace the top level with torch.fx (blocks as leaves), then each group's first block.
   What runs before the first block is the ``embedding`` row, what runs after the last is the
   ``head`` row (for the presets these are exactly the ``embedding`` and ``head`` modules).
3. Run forward and backward once under FlopCounterMode and saved-tensor hooks
   (``autopar.trace.measure``), then add up per row, find tensor-parallel pairs
   (``autopar.trace.tp``) and classify saved bytes.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections import Counter as _Count
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from autopar.trace.measure import (Counter, CudaDropout, Recorder, TagInterpreter, empty_like_tree, replay,
                                   tensor_bytes)
from autopar.trace.tp import attention_core_nodes, find_tp_pairs, region_nodes
from autopar.trace.tracer import CallWrapper, trace_call, trace_error
from costmodels.errors import TraceError
from costmodels.layer_table import LayerRow, LayerTable, TPPair

ACT_DTYPE = torch.bfloat16


@dataclass
class RowInfo:
    name: str
    kind: str
    module: nn.Module | None = None      # the block module (None for embedding / head)
    group: Any = None                    # (structural group, input signature) of a block
    rep: int | None = None               # row index of the measured block of its group
    call_node: fx.Node | None = None     # the top-level call_module node of a block


@dataclass
class TraceResult:
    """Everything the trace knows: the LayerTable, the fx graphs and the measurements."""

    table: LayerTable
    model: nn.Module
    top: fx.GraphModule                      # top level, blocks as call_module leaves
    blocks: dict[int, fx.GraphModule]        # row index of a measured block -> its graph
    rows: list[RowInfo]
    node_row: dict[str, int]                 # top-level node name -> row index
    rec: Recorder
    _graph: Any = field(default=None, repr=False)

    @property
    def graph(self):
        """networkx DiGraph of the whole model: one node per fx node (blocks expanded as
        ``<row>/<node>``), with attributes row, op, target, fwd_flops, bwd_flops,
        output_bytes, param_bytes, saved_bytes."""
        if self._graph is None:
            from autopar.trace.graph import build_graph
            self._graph = build_graph(self)
        return self._graph


# --- finding the repeated blocks ---------------------------------------------------------------

def find_block_list(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The largest ModuleList or Sequential (by parameters, then length) whose children share
    one class."""
    best, best_key = None, None
    for name, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) == 0 or m is model:
            continue
        classes = _Count(type(c) for c in m)
        if len(classes) != 1:
            continue
        params = sum(p.numel() for p in m.parameters())
        key = (params, len(m), -name.count("."))
        if best_key is None or key > best_key:
            best, best_key = (name, m), key
    return best


def _simple_attrs(m: nn.Module) -> tuple:
    out = []
    for k, v in vars(m).items():
        if k.startswith("_") or "idx" in k or "index" in k or k in ("layer_id", "layer_number"):
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            out.append((k, v))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def structure_key(m: nn.Module) -> tuple:
    items = []
    for name, sub in m.named_modules():
        items.append((name, type(sub).__qualname__, _simple_attrs(sub)))
    for name, p in m.named_parameters():
        items.append((name, tuple(p.shape), str(p.dtype)))
    for name, b in m.named_buffers():
        items.append((name, tuple(b.shape), str(b.dtype)))
    return tuple(items)


def _value_sig(value) -> tuple:
    leaves, spec = pytree.tree_flatten(value)
    return (str(spec),) + tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x)
                                for x in leaves)


# --- the trace ----------------------------------------------------------------------------------

def _leaf_classes(leaf_modules) -> tuple:
    out = []
    for c in leaf_modules or ():
        if isinstance(c, str):
            out.extend(s.strip() for s in c.split(",") if s.strip())
        else:
            out.append(c)
    return tuple(out)


def _check_leaf_names(model: nn.Module, leaf_classes) -> None:
    names = {type(m).__name__ for m in model.modules()}
    for c in leaf_classes:
        if isinstance(c, str) and c not in names:
            import difflib
            close = difflib.get_close_matches(c, sorted(names), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise TraceError(f"--leaf {c}: the model has no submodule of class '{c}'; {hint}"
                             f"classes in this model: {', '.join(sorted(names)[:12])}")


def trace_graph(source, micro_batch: int = 1, leaf_modules=()) -> TraceResult:
    """Trace ``source`` (a ModelSource) for one micro-batch; see the module docstring."""
    with _tracing_libraries():
        return _trace_graph(source, micro_batch, leaf_modules)


@contextlib.contextmanager
def _tracing_libraries():
    """Tell transformers it is being traced, so that it skips data-dependent checks (e.g.
    packed-sequence detection) that cannot run on meta tensors."""
    patched = []
    iu = sys.modules.get("transformers.utils.import_utils")
    orig = getattr(iu, "is_tracing", None)
    if orig is not None:
        for name, mod in list(sys.modules.items()):
            if name.startswith("transformers") and getattr(mod, "is_tracing", None) is orig:
                setattr(mod, "is_tracing", lambda *a, **k: True)
                patched.append(mod)
    try:
        yield
    finally:
        for mod in patched:
            setattr(mod, "is_tracing", orig)


def _trace_graph(source, micro_batch: int, leaf_modules) -> TraceResult:
    if micro_batch < 1:
        raise TraceError(f"micro-batch must be at least 1 (got {micro_batch})")
    spec = getattr(source, "spec", "model")
    leaf_classes = _leaf_classes(leaf_modules)
    model = source.build("meta", seed=None, attention="math", dtype=ACT_DTYPE)
    model.train()
    _check_leaf_names(model, leaf_classes)
    inputs = tuple(source.example_inputs(micro_batch, "meta"))
    inputs = tuple(x.to(ACT_DTYPE) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs)

    found = find_block_list(model)
    block_ids: dict[int, int] = {}           # id(module) -> block index
    block_list_name, blocks = (found if found else ("", []))
    for i, b in enumerate(blocks):
        block_ids[id(b)] = i
    # structural groups
    groups: dict[tuple, int] = {}
    group_of: list[int] = []
    for b in blocks:
        group_of.append(groups.setdefault(structure_key(b), len(groups)))
    rep_of_group: dict[int, int] = {}
    for i, g in enumerate(group_of):
        rep_of_group.setdefault(g, i)

    # output cache: a block after its group's first is not run during tracing
    out_cache: dict[tuple, Any] = {}

    def output_cache(mod, args, kwargs):
        i = block_ids.get(id(mod))
        if i is None:
            return None
        key = (group_of[i], _value_sig((args, kwargs)))
        if key in out_cache:
            return empty_like_tree(out_cache[key])
        with torch.no_grad():
            out = mod(*args, **kwargs)
        out_cache[key] = out
        return out

    top, _ = trace_call(model, inputs, {}, leaf_classes=leaf_classes,
                        leaf_modules=list(blocks), output_cache=output_cache, what=spec)

    # rows: embedding, blocks..., head; assign top-level nodes to rows
    prefix = "inner."
    block_nodes: list[fx.Node] = []
    for n in top.graph.nodes:
        if n.op == "call_module":
            sub = top.get_submodule(n.target)
            if id(sub) in block_ids:
                block_nodes.append(n)
    nblocks = len(block_nodes)
    rows: list[RowInfo] = [RowInfo("embedding", "embedding")]
    for n in block_nodes:
        mod = top.get_submodule(n.target)
        i = block_ids[id(mod)]
        name = n.target[len(prefix):] if n.target.startswith(prefix) else n.target
        if nblocks != len(blocks) or len({id(top.get_submodule(x.target)) for x in block_nodes}) != nblocks:
            name = f"{name}#{len(rows)}"  # a block called more than once
        # measured once per (structure, input shapes): same code on the same shapes costs the same
        call_sig = _value_sig((fx.node.map_arg(n.args, lambda x: x.meta.get("val")),
                               fx.node.map_arg(n.kwargs, lambda x: x.meta.get("val"))))
        rows.append(RowInfo(name, "block", module=mod, group=(group_of[i], call_sig), call_node=n))
    rows.append(RowInfo("head", "head"))
    if not block_nodes:  # no repeated blocks: one row for the whole model
        rows = [RowInfo("model", "other")]

    node_row: dict[str, int] = {}
    current = 0
    seen_block = 0
    for n in top.graph.nodes:
        if block_nodes and n in block_nodes:
            seen_block += 1
            current = seen_block
        elif block_nodes and seen_block == nblocks and n.op != "placeholder":
            current = nblocks + 1
        if n.op == "placeholder":
            node_row[n.name] = 0
        else:
            node_row[n.name] = current

    # measured representative per group (first call of the group)
    rep_row_of_group: dict[int, int] = {}
    for r, info in enumerate(rows):
        if info.kind == "block":
            info.rep = rep_row_of_group.setdefault(info.group, r)

    # trace each representative block
    block_gms: dict[int, fx.GraphModule] = {}
    for r, info in enumerate(rows):
        if info.kind != "block" or info.rep != r:
            continue
        n = info.call_node
        args = fx.node.map_arg(n.args, lambda x: x.meta.get("val"))
        kwargs = fx.node.map_arg(n.kwargs, lambda x: x.meta.get("val"))
        gm, _ = trace_call(info.module, args, kwargs, leaf_classes=leaf_classes, what=f"{spec} ({info.name})")
        block_gms[r] = gm

    # --- measure ---------------------------------------------------------------------------
    param_keys = set()
    from autopar.trace.measure import storage_key
    for t in list(model.parameters()) + list(model.buffers()):
        param_keys.add(storage_key(t))
    rec = Recorder(param_keys=param_keys)
    row_of_node = {n: node_row[n.name] for n in top.graph.nodes}
    call_row = {info.call_node: r for r, info in enumerate(rows) if info.kind == "block"}

    def call_block(n, args, kwargs):
        r = call_row.get(n)
        if r is None:
            return NotImplemented
        info = rows[r]
        tensors = CallWrapper.tensors_of(args, kwargs)
        if info.rep == r:
            gm = block_gms[r]
            inner = TagInterpreter(gm, rec, lambda m, r=r: (r, m.name))
            out = inner.run(*tensors)
            rec.tag = (r, n.name)
            return out
        return replay(n.meta.get("val"), tensors)

    top_interp = TagInterpreter(top, rec, lambda n: (row_of_node[n], n.name), call_block)
    try:
        with Counter(rec), CudaDropout(), torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
            out = top_interp.run(*[x for x in inputs if isinstance(x, torch.Tensor)])
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
    result.table = _build_table(source, spec, micro_batch, model, result, block_list_name)
    return result


def trace_model(source, micro_batch: int = 1, leaf_modules=()) -> LayerTable:
    """The LayerTable of ``source`` for one micro-batch of ``micro_batch`` sequences."""
    return trace_graph(source, micro_batch, leaf_modules).table


@functools.lru_cache(maxsize=32)
def _table_cached(spec: str, micro_batch: int, seq: int | None, leaf_modules: tuple) -> LayerTable:
    from autopar.models import load_model
    return trace_model(load_model(spec, seq=seq), micro_batch, leaf_modules)


def table_for(spec: str, micro_batch: int = 1, seq: int | None = None, leaf_modules=()) -> LayerTable:
    """Cached ``trace_model(load_model(spec, seq), micro_batch)``."""
    return _table_cached(spec, int(micro_batch), None if seq is None else int(seq), tuple(leaf_modules))


# --- assembling the table --------------------------------------------------------------------

def _row_params(result: TraceResult):
    """Per row: parameters used (objects and names), and which are shared between rows."""
    top = result.top
    used: list[dict[int, tuple[nn.Parameter, list[str]]]] = [dict() for _ in result.rows]
    prefix = "inner."

    def strip(s):
        return s[len(prefix):] if s.startswith(prefix) else s

    for n in top.graph.nodes:
        r = result.node_row[n.name]
        if n.op == "call_module":
            mod = top.get_submodule(n.target)
            for pname, p in mod.named_parameters(remove_duplicate=False):
                used[r].setdefault(id(p), (p, []))[1].append(strip(f"{n.target}.{pname}"))
        elif n.op == "get_attr":
            obj = n.meta.get("val")
            if isinstance(obj, nn.Parameter):
                used[r].setdefault(id(obj), (obj, []))[1].append(strip(n.target))
    # parameters reached inside traced blocks (get_attr inside the block graph) are covered by
    # the block's call_module node; for a representative block the call node is replaced by
    # its graph, but the parameters are the same module's.
    first_row: dict[int, int] = {}
    rows_of: dict[int, set] = {}
    for r, d in enumerate(used):
        for pid in d:
            first_row.setdefault(pid, r)
            rows_of.setdefault(pid, set()).add(r)
    params, tied = [], []
    for r, d in enumerate(used):
        params.append(sum(p.numel() for pid, (p, _) in d.items() if first_row[pid] == r))
        names = sorted({names[0] for pid, (p, names) in d.items() if len(rows_of[pid]) > 1})
        tied.append(tuple(names))
    # parameters never used in forward still count (first row that owns them by name)
    return params, tied


def _boundaries(result: TraceResult) -> list[int]:
    top = result.top
    nrows = len(result.rows)
    cut = [0] * nrows
    out_node = None
    for n in top.graph.nodes:
        if n.op == "output":
            out_node = n
            continue
        r = result.node_row[n.name]
        users = [result.node_row[u.name] for u in n.users if u.op != "output"]
        last = max(users, default=r)
        if last > r:
            b = tensor_bytes(n.meta.get("val"))
            for i in range(r, last):
                cut[i] += b
    if out_node is not None:
        cut[-1] = sum(tensor_bytes(a.meta.get("val")) for a in out_node.all_input_nodes)
    return cut


def _build_table(source, spec, micro_batch, model, result: TraceResult, block_list_name) -> LayerTable:
    rec = result.rec
    rows = result.rows
    nrows = len(rows)
    fwd = [0.0] * nrows
    bwd = [0.0] * nrows
    mm: list[list] = [[] for _ in rows]
    for (r, _), v in rec.fwd_flops.items():
        fwd[r] += v
    for (r, _), v in rec.bwd_flops.items():
        bwd[r] += v
    for (r, _), v in rec.matmuls.items():
        mm[r].extend(v)

    # saved bytes: each storage once, in the first row that saves it
    saved = rec.resolved_saved()
    seen_key: dict = {}
    per_row: list[list] = [[] for _ in rows]
    for s in saved:
        if s.key in seen_key:
            continue
        seen_key[s.key] = s.tag[0]
        per_row[s.tag[0]].append(s)

    # TP pairs, TP-region and attention-core bytes, per measured block
    pairs: dict[int, tuple] = {}
    act_tp = [0] * nrows
    act_core = [0] * nrows
    tp_comm = [0] * nrows
    heads_found = kv_found = None
    for r, gm in result.blocks.items():
        found = find_tp_pairs(gm)
        pairs[r] = tuple(TPPair(column=tuple(_strip(c) for c in p.columns), row=_strip(p.row),
                                heads=p.heads, kv_heads=p.kv_heads) for p in found)
        for p in found:
            if p.heads is not None and heads_found is None:
                heads_found, kv_found = p.heads, p.kv_heads
        region = region_nodes(gm, found)
        core, core_s = attention_core_nodes(gm, found)
        for s in per_row[r]:
            node = s.creator[1] if s.creator and s.creator[0] == r else None
            if node in region:
                act_tp[r] += s.nbytes
            if node in core and not (node in core_s and rec.internal(s)):
                act_core[r] += s.nbytes
        tp_comm[r] = max((rec.out_bytes.get((r, p.row_node), 0) for p in found), default=0)

    # replicate measured blocks
    for r, info in enumerate(rows):
        if info.kind == "block" and info.rep != r:
            q = info.rep
            fwd[r], bwd[r], mm[r] = fwd[q], bwd[q], list(mm[q])
            per_row[r] = per_row[q]
            act_tp[r], act_core[r], tp_comm[r] = act_tp[q], act_core[q], tp_comm[q]
            pairs[r] = pairs[q]

    params, tied = _row_params(result)
    bounds = _boundaries(result)
    out_rows = []
    for r, info in enumerate(rows):
        out_rows.append(LayerRow(
            name=info.name, kind=info.kind, params=int(params[r]), fwd_flops=float(fwd[r]),
            bwd_flops=float(bwd[r]), saved_activation_bytes=int(sum(s.nbytes for s in per_row[r])),
            act_tp_bytes=int(act_tp[r]), act_attention_core_bytes=int(act_core[r]),
            boundary_bytes=int(bounds[r]), tp_pairs=pairs.get(r, ()), tied_params=tied[r],
            tp_comm_bytes=int(tp_comm[r]), matmul_dims=tuple(mm[r])))

    cfg = getattr(source, "config", None)
    hidden = heads = kv_heads = vocab = None
    if cfg is not None:
        hidden = cfg.hidden
        heads = cfg.heads if cfg.family != "mlp" else None
        kv_heads = cfg.n_kv_heads if cfg.family != "mlp" else None
        vocab = cfg.vocab or None
    else:
        hidden, vocab = _infer_shape(model, result)
        heads, kv_heads = heads_found, kv_found
    nblocks = sum(1 for info in rows if info.kind == "block")
    return LayerTable(model=spec, micro_batch=int(micro_batch), seq=int(source.seq), hidden=hidden,
                      heads=heads, kv_heads=kv_heads, vocab=vocab, layers=nblocks,
                      act_dtype_bytes=torch.tensor([], dtype=ACT_DTYPE).element_size(),
                      rows=tuple(out_rows))


def _strip(name: str) -> str:
    return name[len("inner."):] if name.startswith("inner.") else name


def _infer_shape(model: nn.Module, result: TraceResult):
    hidden = vocab = None
    for info in result.rows:
        if info.kind == "block" and info.call_node is not None:
            val = info.call_node.meta.get("val")
            leaves = [x for x in pytree.tree_leaves(val) if isinstance(x, torch.Tensor)]
            if leaves and leaves[0].dim() >= 1:
                hidden = int(leaves[0].shape[-1])
            break
    embs = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if embs:
        vocab = max(m.num_embeddings for m in embs)
    return hidden, vocab
