"""Context parallelism and HSDP in the search's space: which cp degrees and shard groups a
configuration may take.

**cp** (``cp_candidates``). A cp degree must divide the GPUs and cut the sequence into ``2·cp``
equal chunks (``costmodels.contracts.runnable.check_context_parallel``, the runtime's rule);
with sequence parallel tp also divides each rank's ``seq/cp`` tokens. Which degrees are searched
by default — the rule that keeps the search fast: cp > 1 only for sequences of at least
``CP_MIN_SEQ`` = 16,384 tokens (below, a sample's attention is a small share of the step and
its activations fit with tp, pp and recompute, which the space already holds), powers of two up
to ``CP_MAX`` = 32 (the published runs go to 32), each rank keeping at least ``CP_MIN_LOCAL`` =
2,048 tokens (a shorter chunk leaves the ring's sends latency-bound and the matmuls small). A
``--fix cp=N`` is always searched, at any sequence.

**HSDP** (``hsdp_splits``): for a ZeRO-3 configuration with data parallelism on a runtime
that runs HSDP with it (``[capabilities] hsdp_zero``), the split whose shard group fills one
node, ``dp_shard = gpus_per_node / (tp·cp)`` when that is a proper divisor of dp above 1: ZeRO's
per-micro-batch gathers and reduce-scatters stay on NVLink, only the once-per-step all-reduce
of the shards crosses nodes. That is the layout HSDP is used for (torchtitan's
``data_parallel_shard_degree`` = a node); one more configuration, not every divisor, and only
for ZeRO-3, whose gathers run every micro-batch (ZeRO-1/2 move their states once per step, so
a shard group buys them memory, not time; searching their splits too made gpt3-175b's search
30 % larger). ``--fix dp_shard=N`` searches that split with any ZeRO stage.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from costmodels.contracts.errors import PlanError
from costmodels.contracts.runnable import ModelDims, check_context_parallel
from costmodels.profiles.runtime import load_runtime
from costmodels.profiles.runtime_rules import context_parallel_rule, ddp_rule, hsdp_rule

CP_MIN_SEQ = 16_384
CP_MAX = 32
CP_MIN_LOCAL = 2_048


def cp_candidates(shape, gpus: int, fix: dict[str, Any], rt) -> list[int]:
    """The cp degrees searched for ``gpus`` GPUs (module docstring)."""
    if "cp" in fix:
        return [fix["cp"]] if gpus % fix["cp"] == 0 else []
    out = [1]
    if not rt.context_parallel or not shape.heads or not shape.seq or shape.seq < CP_MIN_SEQ:
        return out
    c = 2
    while c <= CP_MAX:
        if gpus % c == 0 and shape.seq % (2 * c) == 0 and shape.seq // c >= CP_MIN_LOCAL:
            out.append(c)
        c *= 2
    return out


def hsdp_splits(c, rt, gpus_per_node: int, fix: dict[str, Any]):
    """``c`` and its HSDP split (module docstring); with ``--fix dp_shard`` only that split."""
    if "dp_shard" in fix:
        s = fix["dp_shard"]
        if c.dp % s == 0 and c.zero >= 1:
            split = replace(c, dp_shard=s if s < c.dp else None)
            if not hsdp_rule(rt, split):
                yield split
        return
    yield c
    if c.dp > 1 and c.zero == 3 and c.zero in rt.hsdp_zero:
        s = gpus_per_node // (c.tp * c.cp)
        if 1 < s < c.dp and c.dp % s == 0:
            yield replace(c, dp_shard=s)


def with_context_parallel(inner, shape, gpus: int, global_batch: int, gpus_per_node: int,
                          fix: dict[str, Any] | None, allow_cross_node_tp: bool,
                          max_micro_batch: int | None, zero_bubble: bool):
    """``inner``'s configurations (``space._configurations``: cp = 1, ``gpus / cp`` GPUs) for
    every cp degree of ``cp_candidates``, given that degree, then their HSDP splits."""
    fix = dict(fix or {})
    rt = load_runtime(fix.get("runtime"))
    dims = ModelDims(rows=shape.rows, heads=shape.heads, kv_heads=shape.kv_heads, seq=shape.seq)
    for cp in cp_candidates(shape, gpus, fix, rt):
        for c in inner(shape, gpus // cp, global_batch, gpus_per_node, fix, allow_cross_node_tp,
                       max_micro_batch, zero_bubble):
            if cp > 1:
                c = replace(c, cp=cp)
                if context_parallel_rule(rt, c) or ddp_rule(rt, c):
                    continue
                try:
                    check_context_parallel(c, dims)
                except PlanError:
                    continue
            yield from hsdp_splits(c, rt, gpus_per_node, fix)
