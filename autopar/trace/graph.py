"""The whole model as a networkx DiGraph (built on demand from a TraceResult).

Nodes are fx nodes: top-level nodes by name, nodes inside block ``blocks.3`` as
``blocks.3/<node>`` (every block expanded; blocks that were not measured themselves carry the
figures of their group's measured block). Attributes: ``row`` (row index), ``row_name``,
``op``, ``target``, ``fwd_flops``, ``bwd_flops``, ``output_bytes``, ``param_bytes``,
``saved_bytes`` (bytes this node saved for backward, each storage once).
"""
from __future__ import annotations

import networkx as nx
import torch.fx as fx
import torch.nn as nn

from autopar.trace.measure import tensor_bytes


def _param_bytes(gm: fx.GraphModule, n: fx.Node) -> int:
    if n.op == "call_module":
        return sum(p.numel() * p.element_size() for p in gm.get_submodule(n.target).parameters())
    if n.op == "get_attr":
        v = n.meta.get("val")
        if isinstance(v, nn.Parameter):
            return v.numel() * v.element_size()
    return 0


def build_graph(result) -> nx.DiGraph:
    rec = result.rec
    saved_by: dict = {}
    seen = set()
    for s in rec.resolved_saved():
        if s.key in seen:
            continue
        seen.add(s.key)
        saved_by[s.tag] = saved_by.get(s.tag, 0) + s.nbytes
    g = nx.DiGraph()
    top = result.top
    rows = result.rows
    call_row = {info.call_node.name: r for r, info in enumerate(rows) if info.kind == "block"}
    exits: dict[str, str] = {}   # top-level block node -> id of the node producing its output

    def add(node_id, r, gm, n, tag):
        g.add_node(node_id, row=r, row_name=rows[r].name, op=n.op, target=str(n.target),
                   fwd_flops=float(rec.fwd_flops.get(tag, 0)), bwd_flops=float(rec.bwd_flops.get(tag, 0)),
                   output_bytes=int(tensor_bytes(n.meta.get("val")) if n.op != "output" else 0),
                   param_bytes=int(_param_bytes(gm, n)), saved_bytes=int(saved_by.get(tag, 0)))

    for n in top.graph.nodes:
        r = result.node_row[n.name]
        if n.name in call_row and rows[r].rep is not None:
            rep = rows[r].rep
            gm = result.blocks[rep]
            prefix = rows[r].name + "/"
            entry = []
            for m in gm.graph.nodes:
                add(prefix + m.name, r, gm, m, (rep, m.name))
                for a in m.all_input_nodes:
                    g.add_edge(prefix + a.name, prefix + m.name)
                if m.op == "placeholder":
                    entry.append(prefix + m.name)
                if m.op == "output":
                    exits[n.name] = prefix + m.name
            for a in n.all_input_nodes:
                src = exits.get(a.name, a.name)
                for e in entry:
                    g.add_edge(src, e)
            continue
        add(n.name, r, top, n, (r, n.name))
        for a in n.all_input_nodes:
            g.add_edge(exits.get(a.name, a.name), n.name)
    return g
