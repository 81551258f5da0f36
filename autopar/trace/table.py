"""Assembling the LayerTable from a finished trace's measurements.

Separate from the trace itself (``autopar.trace.driver``): this is where per-node measurements
become per-row figures — FLOPs and matmuls summed per row, each saved storage counted once in the
first row that saves it, TP pairs and the TP-region / attention-core share of saved bytes per
measured block, parameters (tied ones once), bytes crossing each row boundary — and where blocks
that were not measured get copies of their group's measured block.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from autopar.trace.blocks import module_path
from autopar.trace.crossing import dead_elements
from autopar.trace.experts import with_expert_facts
from autopar.trace.measure import tensor_bytes
from autopar.trace.tp import attention_core_nodes, attention_mask_nodes, find_tp_pairs, region_nodes
from costmodels.contracts.layer_table import LayerRow, LayerTable, TPPair

if TYPE_CHECKING:
    from autopar.trace.result import TraceResult


def _row_params(result: TraceResult) -> tuple[list[int], list[tuple[str, ...]]]:
    """Per row: the parameter count (a parameter used by several rows counts in the first) and
    the names of its parameters shared with other rows."""
    top = result.top
    used: list[dict[int, tuple[nn.Parameter, list[str]]]] = [dict() for _ in result.rows]
    for n in top.graph.nodes:
        r = result.node_row[n.name]
        if n.op == "call_module":
            # a measured block's parameters are reached here too: its call node is this module
            mod = top.get_submodule(n.target)
            for pname, p in mod.named_parameters(remove_duplicate=False):
                used[r].setdefault(id(p), (p, []))[1].append(module_path(f"{n.target}.{pname}"))
        elif n.op == "get_attr":
            obj = n.meta.get("val")
            if isinstance(obj, nn.Parameter):
                used[r].setdefault(id(obj), (obj, []))[1].append(module_path(n.target))
    first_row: dict[int, int] = {}
    rows_of: dict[int, set] = {}
    for r, d in enumerate(used):
        for pid in d:
            first_row.setdefault(pid, r)
            rows_of.setdefault(pid, set()).add(r)
    params, tied = [], []
    for r, d in enumerate(used):
        params.append(sum(p.numel() for pid, (p, _) in d.items() if first_row[pid] == r))
        tied.append(tuple(sorted({names[0] for pid, (_, names) in d.items() if len(rows_of[pid]) > 1})))
    return params, tied


def _boundaries(result: TraceResult) -> list[int]:
    """Per row: bytes of the values it (or an earlier row) produces that a later row reads; the
    last row's is the model's output."""
    top = result.top
    cut = [0] * len(result.rows)
    out_node = None
    for n in top.graph.nodes:
        if n.op == "output":
            out_node = n
            continue
        r = result.node_row[n.name]
        last = max((result.node_row[u.name] for u in n.users if u.op != "output"), default=r)
        if last > r:
            val = n.meta.get("val")
            dead = dead_elements(n, [u for u in n.users if u.op != "output" and result.node_row[u.name] > r])
            b = tensor_bytes([v for i, v in enumerate(val) if i not in dead] if dead else val)   # cut.py
            for i in range(r, last):
                cut[i] += b
    if out_node is not None:
        cut[-1] = sum(tensor_bytes(a.meta.get("val")) for a in out_node.all_input_nodes)
    return cut


def _replicated_tensors(gm, found) -> int:
    """Parameter tensors of a block that Megatron TP leaves whole: all but the column-parallel
    linears' weights and biases and the row-parallel linears' weights."""
    sharded = set()
    for p in found:
        for c in p.columns:
            sharded.update({f"{module_path(c)}.weight", f"{module_path(c)}.bias"})
        sharded.add(f"{module_path(p.row)}.weight")
    return sum(1 for name, _ in gm.named_parameters() if module_path(name) not in sharded)


def build_table(source, spec: str, micro_batch: int, result: TraceResult,
                act_dtype: torch.dtype) -> LayerTable:
    """The LayerTable of a finished trace (``result.table`` is not read)."""
    rec = result.rec
    rows = result.rows
    nrows = len(rows)
    fwd = [0.0] * nrows
    bwd = [0.0] * nrows
    wgt = [0.0] * nrows
    mm: list[list] = [[] for _ in rows]
    for (r, _), v in rec.fwd_flops.items():
        fwd[r] += v
    for (r, _), v in rec.bwd_flops.items():
        bwd[r] += v
    for (r, _), v in rec.wgt_flops.items():
        wgt[r] += v
    for (r, _), v in rec.matmuls.items():
        mm[r].extend(v)

    # saved bytes: each storage once, in the first row that saves it
    seen_key: set = set()
    per_row: list[list] = [[] for _ in rows]
    for s in rec.resolved_saved():
        if s.key not in seen_key:
            seen_key.add(s.key)
            per_row[s.tag[0]].append(s)

    # TP pairs, TP-region and attention-core bytes, per measured block
    pairs: dict[int, tuple] = {}
    act_tp = [0] * nrows
    act_core = [0] * nrows
    act_mask = [0] * nrows
    tp_comm = [0] * nrows
    replicated = [0] * nrows
    heads_found = kv_found = None
    for r, gm in result.blocks.items():
        found = find_tp_pairs(gm)
        pairs[r] = tuple(TPPair(column=tuple(module_path(c) for c in p.columns), row=module_path(p.row),
                                heads=p.heads, kv_heads=p.kv_heads) for p in found)
        for p in found:
            if p.heads is not None and heads_found is None:
                heads_found, kv_found = p.heads, p.kv_heads
        region = region_nodes(gm, found)
        core, core_s = attention_core_nodes(gm, found)
        mask = attention_mask_nodes(gm, core)
        for s in per_row[r]:
            node = s.creator[1] if s.creator and s.creator[0] == r else None
            if node in region:
                act_tp[r] += s.nbytes
            if node in core and not (node in core_s and rec.internal(s)):
                act_core[r] += s.nbytes
            if node in mask and node not in region:
                act_mask[r] += s.nbytes
        tp_comm[r] = max((rec.out_bytes.get((r, p.row_node), 0) for p in found), default=0)
        if found:
            replicated[r] = _replicated_tensors(gm, found)

    # blocks not measured: copies of their group's measured block
    for r, info in enumerate(rows):
        if info.kind == "block" and info.rep != r:
            q = info.rep
            fwd[r], bwd[r], wgt[r], mm[r] = fwd[q], bwd[q], wgt[q], list(mm[q])
            per_row[r] = per_row[q]
            act_tp[r], act_core[r], tp_comm[r] = act_tp[q], act_core[q], tp_comm[q]
            act_mask[r] = act_mask[q]
            replicated[r] = replicated[q]
            pairs[r] = pairs[q]

    params, tied = _row_params(result)
    bounds = _boundaries(result)
    out_rows = tuple(LayerRow(
        name=info.name, kind=info.kind, params=int(params[r]), fwd_flops=float(fwd[r]),
        bwd_flops=float(bwd[r]), bwd_weight_flops=float(min(wgt[r], bwd[r])),
        saved_activation_bytes=int(sum(s.nbytes for s in per_row[r])),
        act_tp_bytes=int(act_tp[r]), act_attention_core_bytes=int(act_core[r]),
        boundary_bytes=int(bounds[r]), tp_pairs=pairs.get(r, ()), tied_params=tied[r],
        tp_comm_bytes=int(tp_comm[r]), matmul_dims=tuple(mm[r]),
        tp_replicated_tensors=int(replicated[r]), act_attention_mask_bytes=int(act_mask[r]))
        for r, info in enumerate(rows))

    cfg = getattr(source, "config", None)
    if cfg is not None:
        hidden = cfg.hidden
        heads = cfg.heads if cfg.family != "mlp" else None
        kv_heads = cfg.n_kv_heads if cfg.family != "mlp" else None
        vocab = cfg.vocab or None
    else:
        hidden, vocab = _infer_shape(result)
        heads, kv_heads = heads_found, kv_found
    nblocks = sum(1 for info in rows if info.kind == "block")
    seq = source.seq if cfg is not None else _tokens(rows, source.seq)
    dtype_bytes = torch.tensor([], dtype=act_dtype).element_size()
    out_rows = with_expert_facts(out_rows, result.model, int(micro_batch), int(seq), hidden, dtype_bytes)
    return LayerTable(model=spec, micro_batch=int(micro_batch), seq=int(seq), hidden=hidden,
                      heads=heads, kv_heads=kv_heads, vocab=vocab, layers=nblocks,
                      act_dtype_bytes=torch.tensor([], dtype=act_dtype).element_size(),
                      rows=out_rows, fused_attention=getattr(source, "fused_attention", True))


def _infer_shape(result: TraceResult) -> tuple[int | None, int | None]:
    """(hidden, vocab) of a model without a config: the first block's output width and the
    largest embedding table."""
    hidden = vocab = None
    for info in result.rows:
        if info.kind == "block" and info.call_node is not None:
            val = info.call_node.meta.get("val")
            leaves = [x for x in pytree.tree_leaves(val) if isinstance(x, torch.Tensor)]
            if leaves and leaves[0].dim() >= 1:
                hidden = int(leaves[0].shape[-1])
            break
    embs = [m for m in result.model.modules() if isinstance(m, nn.Embedding)]
    if embs:
        vocab = max(m.num_embeddings for m in embs)
    return hidden, vocab


def _tokens(rows, default: int) -> int:
    """Tokens per sample as the blocks see them: the first block input's dim 1 when it is
    (B, T, C) — an image model's patches (+ class token), not its input's channels."""
    block = next((info for info in rows if info.kind == "block" and info.call_node is not None), None)
    if block is not None and block.call_node.args:
        first = block.call_node.args[0]
        val = first.meta.get("val") if hasattr(first, "meta") else None
        if isinstance(val, torch.Tensor) and val.dim() == 3:
            return int(val.shape[1])
    return default
