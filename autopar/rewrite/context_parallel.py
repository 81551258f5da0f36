"""Context parallel rewrite of one row (a torch.fx pass run after the tensor-parallel one).

Under ``cp`` a row runs on ``S / cp`` tokens of each sample, in the load-balanced order of
``autopar.rewrite.cp_attention`` (the Runner slices inputs and targets so). What must change in
the row's graph is everything that mixes or numbers tokens:

* **attention** — ``F.scaled_dot_product_attention`` calls, and softmax attention cores written
  out (``q @ kᵀ`` → scale → mask → softmax → dropout → ``@ v``, the same core the trace prices
  and selective recompute checkpoints) — becomes one ``ContextParallelAttention`` leaf module
  (the local queries against every key, all-gathered over the cp group, causal by global
  position). A core with a mask is taken as causal (a ``masked_fill`` with a buffer must be
  lower-triangular, an additive mask is a decoder's causal mask); a padding mask among the
  model's inputs is refused before each step (``autopar.runtime.step.cp_masks``).
* **position ids** — ``torch.arange(T)`` (GPT's learned positions, transformers'
  ``cache_position`` / ``position_ids``, so its rotary tables) becomes the local tokens' global
  positions (``cp_positions``);
* **position tables** — ``buffer[:T]`` of a buffer (Llama's ``cos`` / ``sin``) becomes those
  rows of the table (``cp_select_rows``).

A block in which no attention is found is refused in one line naming the module: its tokens
would attend to their own chunk only.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from autopar.rewrite.cp_attention import ContextParallelAttention, cp_positions, cp_select_rows
from autopar.rewrite.cp_mask_check import biased_rows
from autopar.trace.fx_graph import INPUTS, USERS, is_activation_matmul, is_softmax, nearest, walk
from costmodels.contracts.errors import PlanError

_TRANSPOSES = {"transpose", "mT"}


def apply_context_parallel(gm: fx.GraphModule, *, kind: str, cp: int, rank: int, group,
                           name: str) -> fx.GraphModule:
    """Rewrite ``gm`` (one row, tp-rewritten or traced) in place for cp rank ``rank`` of
    ``cp``; ``name``: the row's module name for the refusal line."""
    g = gm.graph
    _positions(gm, cp, rank)
    found = _attention(gm, cp, rank, group, name)
    if kind == "block" and not found:
        raise PlanError(f"context parallel (cp={cp}): no attention found in block '{name}' "
                        "(neither F.scaled_dot_product_attention nor a softmax between two "
                        "activation matmuls), so its tokens cannot see the other cp ranks' keys; "
                        "use cp=1 for this model")
    g.lint()
    gm.recompile()
    gm.autopar_cp = {"cp": cp, "rank": rank, "attention": found}
    return gm


def _positions(gm: fx.GraphModule, cp: int, rank: int) -> None:
    buffers = dict(gm.named_buffers())
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is torch.arange:
            end = _arange_end(n)
            if end is None:
                continue
            with gm.graph.inserting_before(n):
                new = gm.graph.call_function(cp_positions, (end, cp, rank),
                                             {"device": n.kwargs.get("device"),
                                              "dtype": n.kwargs.get("dtype")})
            n.replace_all_uses_with(new)
            gm.graph.erase_node(n)
        elif (n.op == "call_function" and n.target is operator.getitem
              and isinstance(n.args[0], fx.Node) and n.args[0].op == "get_attr"
              and n.args[0].target in buffers):
            stop, rest = _prefix_stop(n.args[1])
            if stop is None:
                continue
            with gm.graph.inserting_before(n):
                new = gm.graph.call_function(cp_select_rows, (n.args[0], stop, cp, rank))
                if rest:   # table[:T, 0] -> rows[:, 0]
                    new = gm.graph.call_function(operator.getitem, (new, (slice(None), *rest)))
            n.replace_all_uses_with(new)
            gm.graph.erase_node(n)


def _arange_end(n: fx.Node):
    """The length of ``torch.arange(end)`` / ``arange(0, end)`` (step 1), else None."""
    args = list(n.args)
    if "end" in n.kwargs:
        args = [n.kwargs.get("start", 0), n.kwargs["end"]]
    if len(args) == 1:
        return args[0]
    if len(args) == 2 and args[0] == 0 and n.kwargs.get("step", 1) == 1:
        return args[1]
    return None


def _prefix_stop(index):
    """(``stop``, the other indices) of an index ``[:stop]`` or ``[:stop, …]`` on dim 0, else
    (None, ())."""
    first = index[0] if isinstance(index, tuple) and index else index
    if isinstance(first, slice) and first.start in (None, 0) and first.step in (None, 1) \
            and first.stop is not None:
        return first.stop, tuple(index[1:]) if isinstance(index, tuple) else ()
    return None, ()


def _attention(gm: fx.GraphModule, cp: int, rank: int, group, name: str = "") -> int:
    g = gm.graph
    order = {n: i for i, n in enumerate(g.nodes)}
    found = 0
    for n in list(g.nodes):
        if n.graph is not g or n not in order:
            continue
        if n.op == "call_function" and n.target is F.scaled_dot_product_attention:
            q, k, v = (list(n.args) + [n.kwargs.get(x) for x in ("query", "key", "value")])[:3]
            causal = bool(n.kwargs.get("is_causal", n.args[5] if len(n.args) > 5 else False))
            mask = n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None)
            if isinstance(mask, fx.Node):   # a mask read from a buffer must be causal; one from the
                _check_causal_buffer(gm, mask, sdpa=True)   # inputs is checked per step (cp_masks)
            causal = causal or mask is not None
            _no_dropout(n.kwargs.get("dropout_p", n.args[4] if len(n.args) > 4 else 0.0))
            _replace(gm, n, (q, k, v), causal, n.kwargs.get("scale"), cp, rank, group, found, sdpa=True,
                     mask=_handed_mask(gm, mask, "attend", name), name=name)
            found += 1
        elif is_softmax(gm, n):
            m1 = nearest(n, INPUTS, is_activation_matmul, limit=64)
            m2 = nearest(n, USERS, is_activation_matmul, limit=64)
            if m1 is None or m2 is None:
                continue
            between, _ = walk([m1], lambda x, n=n: [u for u in x.users if order.get(u, 1 << 30) < order[n]])
            scale, causal, masks = _scores(gm, between, m1)
            after, _ = walk([n], lambda x, m2=m2: [u for u in x.users if order.get(u, 1 << 30) < order[m2]])
            for x in after:
                if x.op == "call_module" and isinstance(gm.get_submodule(x.target), torch.nn.Dropout):
                    _no_dropout(gm.get_submodule(x.target).p)
                elif x.op == "call_function" and x.target is F.dropout:
                    _no_dropout(x.kwargs.get("p", x.args[1] if len(x.args) > 1 else 0.5))
            q, kt, v = m1.args[0], m1.args[1], m2.args[1]
            if isinstance(kt, fx.Node) and _is_transpose(kt):
                k = kt.args[0]
            else:
                with g.inserting_before(m2):
                    k = g.call_method("transpose", (kt, -2, -1))
            handed = [h for m in masks if (h := _handed_mask(gm, *m, name)) is not None]
            _replace(gm, m2, (q, k, v), causal, scale, cp, rank, group, found,
                     mask=handed[0] if handed else None, name=name, more=handed[1:])
            found += 1
    g.eliminate_dead_code(is_impure_node=lambda x: x.is_impure()
                          or (x.op == "call_module" and hasattr(gm.get_submodule(x.target), "group")))
    return found


def _upstream(node) -> list:
    """``node`` and every node it is computed from (``fx_graph.walk``; none for a constant)."""
    return walk([node], INPUTS)[0] if isinstance(node, fx.Node) else []


def _from_input(node) -> bool:
    """Whether a mask node depends on one of the row's inputs (a mask the model computes from
    the data, e.g. from the ids, checked by the cp op each step); one built from buffers and
    constants alone (a causal mask the trace folded) is static: checked here, or left out."""
    return any(x.op == "placeholder" for x in _upstream(node))


def _reads_buffer(gm, node) -> bool:
    """Whether a mask node reads one of the row's buffers (a causal table sliced by the model)."""
    buffers = dict(gm.named_buffers())
    return any(x.op == "get_attr" and x.target in buffers for x in _upstream(node))


def _handed_mask(gm, node, kind, name: str = ""):
    """(mask node, kind, whole) to hand the cp op, or None: a mask from the inputs is checked each
    step for hidden tokens (padding); one the graph builds without a buffer (positions, constants:
    a sliding window, a prefix mask) is also compared with causal (``cp_mask_check``); an additive
    or SDPA one (it may be float) read from a buffer and the positions is still checked for a
    position bias each step (ALiBi's slopes are a buffer); one read from buffers and constants
    alone is checked for a bias now (``_check_bias_buffer``; a ``masked_fill`` one for causality,
    ``_check_causal_buffer``) and is not handed over: a causal mask the trace folded from the
    first local positions is dropped from the graph, as the cp attention applies causality itself."""
    if not isinstance(node, fx.Node):
        return None
    whole = not _reads_buffer(gm, node)
    if whole or _from_input(node):
        return node, kind, whole
    if kind == "fill":
        return None
    if any(x.op == "call_function" and x.target in (cp_positions, cp_select_rows) for x in _upstream(node)):
        return node, kind, False   # buffers and positions (ALiBi's slopes × distances): checked per step
    _check_bias_buffer(gm, node, name)   # buffers / constants alone: checked now, left to dead code
    return None


def _check_bias_buffer(gm, node, name: str) -> None:
    """An additive or SDPA mask computed from buffers and constants alone (a causal mask the trace
    folded, a precomputed ALiBi table): refused when one of its tables of two or more dims adds
    different values to the keys a query sees (``cp_mask_check.biased_rows``)."""
    buffers = dict(gm.named_buffers())
    for x in _upstream(node):
        t = buffers.get(x.target) if x.op == "get_attr" else None
        if isinstance(t, torch.Tensor) and not t.is_meta and t.dim() >= 2 and biased_rows(t, "additive", t.size(-1)):
            raise PlanError(f"context parallel: the attention of '{name}' adds the table '{x.target}' to its "
                            "scores, a position bias (ALiBi, relative) that the cp attention (causal by global "
                            "position, no bias) cannot apply; use cp=1 for this model")


def _no_dropout(p) -> None:
    """Attention dropout is not run by the cp attention: a non-zero probability is refused."""
    if isinstance(p, (int, float)) and p > 0:
        raise PlanError(f"context parallel: attention dropout p={p} is not supported under cp "
                        "(the all-gather attention runs without it); set the attention dropout to 0 "
                        "or use cp=1")


def _is_transpose(n: fx.Node) -> bool:
    if n.op == "call_method" and n.target == "transpose":
        dims = sorted(int(d) % 4 if isinstance(d, int) and d < 0 else d for d in n.args[1:3])
        return dims in ([2, 3],) or sorted(n.args[1:3]) == [-2, -1]
    if n.op == "call_function" and n.target is torch.transpose:
        return sorted(n.args[1:3]) in ([-2, -1], [2, 3])
    return False


def _scores(gm, between, m1) -> tuple[list, bool, list]:
    """(scale factors, causal, masks) of the nodes between the scores matmul and the softmax: each
    factor ``(operator.mul | operator.truediv, a number or a scalar node)``; masks: (the mask
    node, "fill" (True = hidden) or "additive") of each mask or bias applied, for the runtime's
    checks (``cp_mask_check``)."""
    scale, causal, mask = [], False, []
    for x in between:
        if x is m1:
            continue
        t = x.target
        other = [a for a in x.args if a is not m1 and not (isinstance(a, fx.Node) and a in between)]
        if t in (operator.mul, torch.mul, "mul") and other:
            scale.append((operator.mul, other[0]))
        elif t in (operator.truediv, torch.div, "div") and other:
            scale.append((operator.truediv, other[0]))
        elif t in ("masked_fill", torch.masked_fill):
            _check_causal_buffer(gm, x)
            causal = True
            if len(x.args) > 1 and isinstance(x.args[1], fx.Node):
                mask.append((x.args[1], "fill"))
        elif t in (operator.add, torch.add, "add") and any(isinstance(a, fx.Node) for a in other):
            causal = True
            mask.append((next(a for a in other if isinstance(a, fx.Node)), "additive"))
    return scale, causal, mask


def _check_causal_buffer(gm, node, sdpa: bool = False) -> None:
    """A ``masked_fill`` whose mask comes from a buffer: the buffer must be lower-triangular
    (a causal mask); a real one that is not is refused. ``sdpa``: ``node`` is SDPA's
    ``attn_mask`` itself (True / 0 where a query sees a key, so an additive one is 0 on and
    below the diagonal)."""
    buffers = dict(gm.named_buffers())
    start = node if sdpa else node.args[1] if len(node.args) > 1 else None
    for x in _upstream(start):
        if x.op == "get_attr" and x.target in buffers:
            t = buffers[x.target]
            if not t.is_meta and t.dim() >= 2:
                m = t.reshape(-1, *t.shape[-2:])[0]
                seen_where = (m == 0) if sdpa and m.is_floating_point() else (m != 0)
                if not torch.equal(seen_where, torch.tril(torch.ones_like(m)) != 0):
                    raise PlanError(f"context parallel: the attention mask buffer '{x.target}' is not "
                                    "causal (lower-triangular) or adds a position bias (ALiBi) where it is; only "
                                    "causal attention without a bias runs under cp; use cp=1")


def _replace(gm, node, qkv, causal, scale, cp, rank, group, i, sdpa: bool = False, mask=None,
             name: str = "", more=()) -> None:
    """``node`` (the attention's output) computed by a new ContextParallelAttention on
    ``qkv``; ``scale``: None (1/√d), a number, or factors from ``_scores``; ``mask``: (node,
    kind) of the mask the model applied, handed to the op so each step checks it hides no
    token from itself (a padding mask, ``cp_attention.hidden_diagonal``)."""
    module = f"cp_attention_{i}"
    while hasattr(gm, module):
        module += "_"
    op = ContextParallelAttention(group, cp, rank, causal, None, sdpa=sdpa)
    op.mask_kind, op.where = (mask[1] if mask else None), name
    op.mask_whole = bool(mask[2]) if mask and len(mask) > 2 else False
    op.more_masks = [(m[1], bool(m[2])) for m in more]   # further masks / biases: checked with the first
    gm.add_submodule(module, op)
    with gm.graph.inserting_before(node):
        if isinstance(scale, list):   # factors: a number, or a node computing it (√d of a size)
            value = 1.0
            for op, f in scale:
                value = gm.graph.call_function(op, (value, f)) if isinstance(value, fx.Node) or \
                    isinstance(f, fx.Node) else op(value, f)
            scale = value
        new = gm.graph.call_module(module, (*qkv, scale) + ((mask[0],) if mask else ())
                                   + tuple(m[0] for m in more))
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
