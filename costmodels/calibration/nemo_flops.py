"""Step times behind NeMo's published "TFLOPS / GPU": the model FLOPs NeMo counts per step.

NeMo's performance tables (the long-sequence sweeps of ``performance_long_sequence.md`` among
them) publish throughput as model TFLOP/s per GPU, not a step time. The FLOPs are NeMo's own
count, ``nemo/utils/flops_formulas.py`` (NVIDIA/NeMo, commit 034b17b; ``llama2`` and ``llama3``
are the same expression)::

    F = gbs · s · L · h² · (12 + 12·g/a + 18·f/h + 12·s/h + 6·V/(L·h))

(``g`` query groups, ``a`` heads, ``f`` ffn width, ``V`` vocabulary): the attention term
``12·s/h`` counts the whole ``s × s`` score matrix, twice what a causal kernel computes, so at
1M tokens a "TFLOP/s" is about half a real one. The step is then ``F / (TFLOP/s · GPUs)``.
Checked against runs that publish both (``tests/test_costmodels_nemo_flops.py``: the dgxc
Llama 3.1 rows' step and MFU agree within 0.5 %).
"""
from __future__ import annotations


def nemo_llama_flops(gbs: int, seq: int, layers: int, hidden: int, heads: int, kv_heads: int,
                     ffn: int, vocab: int) -> float:
    """Model FLOPs of one step as NeMo counts them for Llama 2 / 3 (module docstring)."""
    h = float(hidden)
    return (float(gbs) * seq * layers * h * h
            * (12 + 12 * kv_heads / heads + 18 * ffn / h + 12 * seq / h + 6 * vocab / (layers * h)))


def step_from_tflops(flops: float, tflops_per_gpu: float, gpus: int) -> float:
    """The step time a published TFLOP/s per GPU stands for."""
    return flops / (tflops_per_gpu * 1e12 * gpus)
