"""The fields a runtime profile file may hold: its figures per section with their ranges
(``FIGURES``), the precisions it can name, and the readers that check each value in one line.

Split from ``runtime`` (which loads, registers and applies options) so the figure table and its
checks read on their own; ``runtime`` re-exports ``FIGURES`` and ``ALL_PRECISIONS``.
"""
from __future__ import annotations

import math
from typing import Any

from costmodels.contracts.plan import SCHEDULES

ALL_SCHEDULES = SCHEDULES   # every schedule a plan can name (costmodels.contracts.plan)
ALL_PRECISIONS = ("bf16-mixed", "amp", "fp32")
# [section] -> figure -> (attribute, minimum, maximum, integer)
FIGURES = {
    "overlap": {"dp_sync": ("dp_overlap", 0.0, 1.0, False),
                "dp_bucket_bytes": ("dp_bucket_bytes", 0.0, None, False),
                "param_gather": ("param_gather_overlap", 0.0, 1.0, False),
                "zero_gathers": ("zero_overlap", 0.0, 1.0, False),
                "zero_edges_exposed": ("zero_edges_exposed", 0, 1, True),
                "zero_reduce_per_micro_batch": ("zero_reduce_per_micro_batch", 0, 1, True),
                "zero2_gather_per_micro_batch": ("zero2_gather_per_micro_batch", 0, 1, True),
                "pipeline_zero_reduce_per_micro_batch":   # dp_sync.zero_row_collectives, pp > 1 only
                    ("pipeline_zero_reduce_per_micro_batch", 0, 1, True),
                "compute_slowdown": ("compute_slowdown", 0.0, 1.0, False),
                "tp_comm_overlap": ("tp_comm_overlap", 0, 1, True),   # costmodels.model.tp_overlap
                "dp_sync_per_chunk": ("dp_sync_per_chunk", 0, 1, True),   # costmodels.profiles.interleaved_dp_window
                "tp_bwd_reduce_scatter_exposed": ("tp_bwd_reduce_scatter_exposed", 0, 1, True),   # async_tp_fusion
                "tp_fwd_reduce_scatter_fp8": ("tp_fwd_reduce_scatter_fp8", 0.0, 1.0, False),   # fp8_tensor_parallel
                "pp_p2p_overlap": ("pp_p2p_overlap", 0, 1, True),   # costmodels.model.interleaved_p2p_overlap
                "param_gather_exposed_buckets": ("param_gather_exposed_buckets", 0.0, 64.0, False)},   # step_tail
    "communication": {"grad_reduce_bytes": ("grad_reduce_bytes", 1.0, 8.0, False),
                      "zero_collectives_per_row": ("zero_collectives_per_row", 1.0, 64.0, False),
                      "amax_reductions_per_chunk": ("amax_reductions_per_chunk", 0, 8, True),   # amax_reduction
                      "amax_reduce_over_dp": ("amax_reduce_over_dp", 0, 1, True)},   # amax_reduction
    "kernels": {"elementwise_bytes_per_saved_byte": ("elementwise_traffic", 0.0, 100.0, False),
                "loss_saved_bytes_per_logit": ("loss_saved_bytes", 0.0, 64.0, False),
                "loss_grad_bytes_per_logit": ("loss_grad_bytes", 0.0, 64.0, False),   # loss_backward_memory
                "loss_parallel_grad_bytes_per_logit": ("loss_parallel_grad_bytes", 0.0, 64.0, False),   # tp > 1
                "gather_copy_passes": ("gather_copy_passes", 0.0, 16.0, False),
                "reduce_copy_passes": ("reduce_copy_passes", 0.0, 16.0, False),
                "grad_accumulate_bytes_per_param": ("grad_accumulate_bytes", 0.0, 64.0, False),
                "grad_buffer_zero_passes": ("grad_buffer_zero_passes", 0.0, 4.0, False),   # step_tail
                "unfused_norm_fwd_bytes_per_element": ("unfused_norm_fwd_bytes", 0.0, 512.0, False),   # eager_norm
                "unfused_norm_bwd_bytes_per_element": ("unfused_norm_bwd_bytes", 0.0, 512.0, False)},
    "host": {"seconds_per_block_pass": ("host_block_s", 0.0, 0.1, False)},
    "memory": {"fragmentation": ("fragmentation", 0.0, 1.0, False),          # costmodels.model.allocator
               "optimizer_state_bytes": ("optimizer_state_bytes", 0.0, 32.0, False),
               "torch_pipelining": ("torch_pipelining", 0, 1, True),   # costmodels.model.pipeline_fsdp_memory
               "tp_saves_gathered_inputs": ("tp_saves_gathered_inputs", 0, 1, True)},   # torch_tp_memory
    "context_parallel": {"overlap": ("cp_overlap", 0.0, 1.0, False),
                         "all_gather_kv": ("cp_all_gather", 0, 1, True)},
    "moe": {"load_imbalance": ("moe_load_imbalance", 1.0, 16.0, False),
            "dispatch_once_per_node": ("moe_dispatch_once_per_node", 0, 1, True),
            "route_consecutive": ("moe_route_consecutive", 0, 1, True),
            "saved_token_copies": ("moe_saved_token_copies", 0, 2, True),
            "tp_token_gather": ("moe_tp_token_gather", 0, 1, True),   # expert_token_gather
            "experts_zero_sharded": ("moe_experts_zero_sharded", 0, 1, True)},   # experts.expert_zero_group
    "recompute": {"early_stop": ("recompute_early_stop", 0, 1, True)},   # costmodels.model.recompute_early_stop
}


def _stack_name(v: Any, full: str, err) -> str:
    if not isinstance(v, str) or not v.strip() or ":" in v:
        raise err(full, f"must be a kernel stack's name (a string without ':'), got {v!r}")
    return v.strip()


def _figures(data: dict, prefix: str, values: dict, sources: dict, err) -> None:
    for sect, figs in FIGURES.items():
        t = data.get(sect)
        if t is None:
            continue
        if not isinstance(t, dict):
            raise err(f"{prefix}{sect}", "must be a table")
        for key in t:
            if key not in figs:
                raise err(f"{prefix}{sect}.{key}", f"is not a known figure ({', '.join(figs)})")
        for key, (attr, lo, hi, integer) in figs.items():
            if key in t:
                values[attr], sources[f"{sect}.{key}"] = _figure(t[key], f"{prefix}{sect}.{key}", lo, hi,
                                                                 integer, err)


def _figure(v: Any, full: str, lo, hi, integer: bool, err) -> tuple[float, str]:
    if not isinstance(v, dict):
        raise err(full, f"must be an inline table {{ value = ..., source = \"...\" }}, got {v!r}")
    if not isinstance(v.get("source"), str) or not v["source"].strip():
        raise err(full + ".source", "is missing or empty (every figure must cite where it comes from)")
    x = v.get("value")
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise err(full + ".value", f"must be a finite number, got {x!r}")
    if integer and not float(x).is_integer():
        raise err(full + ".value", f"must be an integer, got {x!r}")
    if x < lo or (hi is not None and x > hi):
        raise err(full + ".value", f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {x!r}")
    return (int(x) if integer else float(x)), v["source"]


def _capabilities(t: Any, err, sources: dict) -> dict[str, Any]:
    if t is None:
        return {}
    if not isinstance(t, dict):
        raise err("capabilities", "must be a table")
    out: dict[str, Any] = {}
    known = {"zero", "pipeline_zero", "schedules", "uneven_interleaving", "sequence_parallel", "precisions", "source",
             "split_backward_dp_after_step", "context_parallel", "hsdp_zero", "ddp_beside_model_parallel",
             "expert_mesh_over_tp", "fp8_gemm_shapes"}
    for key in t:
        if key not in known:
            raise err(f"capabilities.{key}", f"is not one of {', '.join(sorted(known))}")
    if not isinstance(t.get("source"), str) or not t["source"].strip():
        raise err("capabilities.source", "is missing or empty")
    sources["capabilities"] = t["source"]
    if t.get("hsdp_zero") == []:
        out["hsdp_zero"] = ()
    for key, attr in (("zero", "zero_stages"), ("pipeline_zero", "pipeline_zero"), ("hsdp_zero", "hsdp_zero")):
        if key in t and t[key] != []:
            z = t[key]
            if not isinstance(z, list) or not z or any(isinstance(x, bool) or x not in (0, 1, 2, 3) for x in z):
                raise err(f"capabilities.{key}", f"must be a non-empty list of ZeRO stages 0-3, got {z!r}")
            out[attr] = tuple(sorted(set(int(x) for x in z)))
    for key, attr, allowed in (("schedules", "schedules", ALL_SCHEDULES),
                               ("precisions", "precisions", ALL_PRECISIONS)):
        if key in t:
            v = t[key]
            if not isinstance(v, list) or not v or any(x not in allowed for x in v):
                raise err(f"capabilities.{key}", f"must be a non-empty list of {list(allowed)}, got {v!r}")
            out[attr] = tuple(x for x in allowed if x in v)
    for key in ("uneven_interleaving", "sequence_parallel", "split_backward_dp_after_step", "context_parallel",
                "ddp_beside_model_parallel", "expert_mesh_over_tp"):
        if key in t:
            if not isinstance(t[key], bool):
                raise err(f"capabilities.{key}", f"must be true or false, got {t[key]!r}")
            out[key] = t[key]
    if "fp8_gemm_shapes" in t:   # the stack's FP8 GEMM shape rule (costmodels.profiles.fp8_shapes)
        from costmodels.profiles.fp8_shapes import RULES
        if t["fp8_gemm_shapes"] not in RULES:
            raise err("capabilities.fp8_gemm_shapes",
                      f"must be one of {', '.join(RULES)}, got {t['fp8_gemm_shapes']!r}")
        out["fp8_gemm_shapes"] = t["fp8_gemm_shapes"]
    if 0 not in out.get("zero_stages", (0,)) or 0 not in out.get("pipeline_zero", (0,)):
        raise err("capabilities.zero", "must include 0 (a plan without data parallelism shards nothing)")
    if "1f1b" not in out.get("schedules", ("1f1b",)):
        raise err("capabilities.schedules", "must include '1f1b' (plans without a pipeline use it)")
    return out
