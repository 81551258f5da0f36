"""Activation recompute as fx passes on a (rewritten) row.

* ``"full"``: the whole row runs inside one non-reentrant ``torch.utils.checkpoint``; the row
  becomes submodule ``row`` of a two-line wrapper graph (local parameter names gain ``row.``).
* ``"selective"`` (Korthikanti et al. 2022): only the attention core — from the scores matmul
  ``q @ kᵀ`` through scaling, masking, softmax and attention dropout to ``att @ v`` — is moved into
  a parameter-free submodule ``attention_core`` called under non-reentrant checkpoint, so its s²
  activations are recomputed in backward instead of stored. Fused attention
  (``F.scaled_dot_product_attention``) is checkpointed as one call. Rows without attention are
  left as they are. Dropout masks are reproduced (checkpoint restores the RNG state).
* ``"none"``: unchanged.
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
import torch.utils.checkpoint

# One definition of "attention core" for the cost model and the rewrite: what the trace counts as
# recomputed is exactly what is wrapped here.
from autopar.trace.fx_graph import INPUTS, USERS, is_activation_matmul, is_softmax, nearest, walk
from autopar.trace.tp import attention_core_nodes
from costmodels.contracts.errors import PlanError


def apply_recompute(gm: fx.GraphModule, recompute: str) -> fx.GraphModule:
    if recompute == "selective":
        selective(gm)
        _, left = attention_core_nodes(gm, [])   # softmax cores still outside a checkpoint
        if left:
            raise PlanError(f"recompute='selective': {type(gm).__name__} has a softmax between "
                            f"activation matmuls (after {sorted(left)[0]}) but its attention core "
                            "could not be isolated for checkpointing (an intermediate is used "
                            "outside it); use recompute='full' or 'none' for this model")
    elif recompute == "full":
        gm = full(gm)
    return gm


def _is_sdpa(n):
    return n.op == "call_function" and n.target is F.scaled_dot_product_attention


def _is_cp_attention(gm, n):
    """The context-parallel attention (``autopar.rewrite.cp_attention``): checkpointed whole,
    its all-gather of K/V run again in backward."""
    if n.op != "call_module":
        return False
    from autopar.rewrite.cp_attention import ContextParallelAttention
    return isinstance(gm.get_submodule(n.target), ContextParallelAttention)


def selective(gm: fx.GraphModule) -> int:
    """Checkpoint each attention core in place; returns how many were found."""
    g = gm.graph
    order = {n: i for i, n in enumerate(g.nodes)}
    cores = []
    for n in list(g.nodes):
        if _is_sdpa(n) or _is_cp_attention(gm, n):
            cores.append(([n], n))
        elif is_softmax(gm, n):
            m1 = nearest(n, INPUTS, is_activation_matmul, limit=64)
            m2 = nearest(n, USERS, is_activation_matmul, limit=64)
            if m1 is None or m2 is None:
                continue
            desc, _ = walk([m1], lambda x, m2=m2: [u for u in x.users if order[u] <= order[m2]])
            anc, _ = walk([m2], lambda x, m1=m1: [a for a in x.all_input_nodes if order[a] >= order[m1]])
            core = sorted(set(desc) & set(anc), key=order.get)
            inner = set(core) - {m2}
            if any(u not in core for c in inner for u in c.users):
                continue  # an intermediate of the core is used elsewhere: leave it alone
            cores.append((core, m2))
    for i, (core, out) in enumerate(cores):
        core_set = set(core)
        externals = []
        for c in core:
            for a in c.all_input_nodes:
                if a not in core_set and a not in externals:
                    externals.append(a)
        sub = fx.Graph()
        env = {e: sub.placeholder(e.name) for e in externals}
        root = {}
        for c in core:
            env[c] = sub.node_copy(c, env.__getitem__)
            if c.op == "call_module":
                root[c.target] = gm.get_submodule(c.target)
        sub.output(env[out])
        core_gm = fx.GraphModule(root, sub, class_name="AttentionCore")
        name = "attention_core" if i == 0 else f"attention_core_{i}"
        while hasattr(gm, name):
            name += "_"
        gm.add_submodule(name, core_gm)
        with g.inserting_before(out):
            mod = g.get_attr(name)
            ck = g.call_function(torch.utils.checkpoint.checkpoint, (mod, *externals),
                                 {"use_reentrant": False})
        out.replace_all_uses_with(ck)
        for c in reversed(core):
            g.erase_node(c)
    if cores:
        g.lint()
        still = {n.target for n in g.nodes if n.op == "call_module"}
        for core, _ in cores:
            for c in core:
                if c.op == "call_module" and c.target not in still:
                    gm.delete_submodule(c.target)
                    still.add(c.target)
        gm.recompile()
    return len(cores)


def full(gm: fx.GraphModule) -> fx.GraphModule:
    """Wrap the whole row in one non-reentrant checkpoint."""
    outer = fx.Graph()
    phs = []
    for p in gm.graph.nodes:
        if p.op == "placeholder":
            ph = outer.placeholder(p.target, default_value=p.args[0] if p.args else
                                   __import__("inspect").Signature.empty)
            phs.append(ph)
    row = outer.get_attr("row")
    ck = outer.call_function(torch.utils.checkpoint.checkpoint, (row, *phs), {"use_reentrant": False})
    outer.output(ck)
    new = fx.GraphModule({"row": gm}, outer, class_name=type(gm).__name__.replace("Shard", "") + "Recompute")
    new.autopar_shards = {f"row.{k}": v for k, v in getattr(gm, "autopar_shards", {}).items()}
    new.autopar_info = getattr(gm, "autopar_info", {})
    return new
