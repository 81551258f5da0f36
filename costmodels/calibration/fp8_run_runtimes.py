"""The runtime option string each open FP8 row ran under, read from its stack's scripts and release
(split out of ``fp8_runs``, which reads the rows and prices them): NeMo 2's FP8-only switches and
torchtitan / torchao's fsdp options."""
from __future__ import annotations

from costmodels.calibration.titan_releases import with_release as with_titan_release


def nemo_fp8_runtime(r, runtime: str) -> str:
    """NeMo 2 FP8 rows: ``bf16_grad_reduce`` on. Every NeMo 2 row of fp8_runs.csv ran NeMo's
    performance scripts, which for ``-c fp8`` set ``recipe.trainer.plugins = bf16_with_fp8_mixed()``
    and then ``grad_reduce_in_fp32 = False`` inside that branch (NVIDIA/NeMo v2.2.0
    scripts/llm/performance/pretrain_*.py; scripts/performance/helpers.py
    ``set_precision_configs`` later), while their BF16 runs keep ``bf16_mixed()``'s
    ``grad_reduce_in_fp32=True``: the FP8 run's data-parallel reduce-scatter moves half the
    bytes of its BF16 pair's."""
    if "NeMo 2" not in r["framework"] or r["precision"] == "bf16" or "bf16_grad_reduce" in runtime:
        return runtime
    runtime = runtime + (",bf16_grad_reduce" if ":" in runtime else ":bf16_grad_reduce")
    if r["model"] in TP_ONLY_AMAX_RED:   # amax over tp·cp only (costmodels/model/amax_reduction.py)
        runtime += ",tp_only_amax_red"
    ub = UB_FP8_RS.get(r["model"]) if "H100" in r["gpu"] and "tp_comm_overlap" in runtime else None
    return runtime + "," + ub if ub else runtime


# models whose NeMo 2 performance script sets recipe.model.config.tp_only_amax_red = True (NVIDIA/NeMo
# v2.2.0 scripts/llm/performance/pretrain_gpt3_175b.py; v2.3.0-v2.4.0 scripts/performance/llm/ alike;
# no other pretrain script at those tags)
TP_ONLY_AMAX_RED = ("gpt3-175b",)


# NeMo 2's FP8 H100 userbuffer configs with fp8_buf on the forward reduce-scatters, per model its
# performance scripts pass them for (runtime-profiles/megatron.toml ub_fp8_rs / ub_fp8_rs_proj;
# NVIDIA/NeMo @0594a700 nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py)
UB_FP8_RS = {"llama3-70b": "ub_fp8_rs", "llama3.1-405b": "ub_fp8_rs", "gpt3-175b": "ub_fp8_rs_proj"}


def titan_runtime(r, tp: int) -> str:
    """torchtitan / torchao rows: ``fsdp``, with ``async_tp`` where the row says its run had
    torchtitan's async TP (``enable_async_tensor_parallel``; "AsyncTP" in its label or detail),
    and the switches its torchtitan release implies (``titan_releases``: its compiled loss)."""
    text = (r["row_id"] + r["precision_detail"] + r["notes"]).lower().replace(" ", "")
    runtime = "fsdp:async_tp" if tp > 1 and "asynctp" in text else "fsdp"
    return with_titan_release(runtime, r["framework"], r.get("container") or "")   # its loss, as its release ran it
