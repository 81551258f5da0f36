"""The bf16 weight gradients autocast's weight cache makes a backward hold to its end (amp only).

autopar's runtime runs a whole step — every micro-batch's forward and backward — inside one
``torch.autocast(bfloat16)`` region (``autopar validate``'s ranks: autopar/validate/rank.py
``_Live.step``; ``autopar train``: autopar/runtime/training/loop.py). autocast casts each
matmul weight (and bias) to bf16 once and caches the cast for the region, so the cast's
autograd node, ``ToCopyBackward0``, is created in the FIRST micro-batch's forward and shared by
every later micro-batch's graph. The autograd engine runs ready nodes highest sequence number
first (``ReadyQueue``'s ``CompareNodeTaskTime``: torch/csrc/autograd/engine.h, torch 2.x), and
a node's sequence number is fixed when it is created. In micro-batch 1 the casts' numbers sit
just below their matmuls', so each weight's bf16 gradient is cast to fp32 and freed right after
its matmul's backward. In micro-batch 2…m every cast node is older than every node of the
current graph, so the engine runs them all LAST: each matmul's bf16 weight gradient
(``AddmmBackward0``'s ``mm``) waits in its cast node's input buffer until the whole backward of
the activations is done. At the end of such a backward the stage holds, beside its fp32
gradients, a bf16 gradient of every cached weight: 2 bytes per parameter of the block and head
rows (the ones ``memory``'s ``AUTOCAST_CACHE_BYTES`` charges for the cache itself), over ``t``.

Measured (``autopar validate`` on CPU, gpt:layers=8,hidden=384,heads=4,vocab=256,seq=8, global
batch 8, micro-batch 1, 2026-11-28): the profiler's allocation events at the peak of the memory
step hold 28.31 MB allocated by ``AddmmBackward0``'s ``mm`` (2 × 14.16 M matmul parameters),
allocated up to 250 ms before the peak and freed within 110 ms after it, at pp1·dp1, dp2 ZeRO-1
and ZeRO-2/3 alike; at pp2 each stage holds its half (14.16 MB); ``python
benchmarks/memory_peak_breakdown.py`` lists them. tests/test_memory_autocast_grads.py pins the
order (every cast node of micro-batch 2 runs after the first layer's input gradient, and not so
with autocast's cache off).

``autopar validate`` on that model (amp, micro-batch 1, global batch 8; prediction / measured
peak live bytes; "before" is validate's figure (the highest rank), "now" the lowest rank: a
higher rank of the same plan counts a block freed where the profiler does not look, see
autopar/validate/live_bytes.py; 2026-11-28, load 17–24 on 2 cores):

    plan             before: predicted / measured       now: predicted / measured
    pp1 dp2 ZeRO-1   259.9 / 289.6 MB  (−10.3 %)        287.5 / 289.6 MB  (−0.7 %)
    pp1 dp2 ZeRO-2   231.1 / 267.9     (−13.8 %)        258.7 / 260.8     (−0.8 %; other rank 282.1)
    pp1 dp2 ZeRO-3   186.8 / 216.8     (−13.8 %)        215.3 / 216.3     (−0.5 %; other rank 223.8)
    pp2 dp1 ZeRO-0   144.1 / 175.3     (−17.8 %)        144.1 / 146.2     (−1.5 %)
    pp2 dp2 ZeRO-1   130.3 / 175.5     (last stop)      144.0 / 145.9     (−1.3 %; one rank 160.4)
    pp2 dp2 ZeRO-2   115.9 / 160.8     (last stop)      129.6 / 131.8     (−1.6 %)
    pp2 dp2 ZeRO-3   115.2 / 169.2     (last stop)      129.6 / 133.3     (−2.7 %; one rank 140.5)

(All on the runtime before ppzero's pp + ZeRO change was merged: its pp rows held the last
stage's outputs and, at ZeRO-2/3, whole gradients; the model priced the same then.)
The pp rows' measured fall is autopar/validate/rank.py's fix (it kept the unsplit model, so
every other stage's weights, live through the memory step); the predicted rise is this term.

Not priced: the same bytes at the end of a backward that is not the step's last while later
micro-batches' activations are in flight (pipeline steady state); with the tiny activations of
the measured plans that moment never wins.

fp32 (no autocast) and bf16-mixed (Megatron / DeepSpeed / torchtitan keep bf16 or fp32 weights
with no per-step cast cache) hold none of this; nor does a step of one micro-batch.
"""
from __future__ import annotations

CAST_GRAD_BYTES = 2.0   # a bf16 gradient per cached (bf16-cast) weight element


def held_cast_grad_bytes(cached_params: float, *, precision: str, m: int) -> float:
    """Bytes of bf16 weight gradients held at the end of a backward of micro-batch 2…m:
    ``cached_params`` (this GPU's autocast-cached weight elements, already over ``t``) × 2,
    under ``precision="amp"`` with ``m > 1`` micro-batches per step; 0 otherwise."""
    if precision != "amp" or m <= 1:
        return 0.0
    return CAST_GRAD_BYTES * cached_params
