"""A plan's ``precision`` (FP8 matmuls) in each target's words, and back.

    Megatron-LM     fp8:   --fp8-format hybrid --fp8-recipe delayed   (Transformer Engine's delayed
                           scaling, E4M3 forward / E5M2 backward: what costmodels/model/precision.py
                           prices for the megatron stack); tensorwise reads back as fp8 too
                    mxfp8: --fp8-format e4m3 --fp8-recipe mxfp8
                    fp8-rowwise: no Megatron recipe (blockwise is 128-element tiles) — refused
    torchtitan      fp8 / fp8-rowwise: [model] converters = ["quantize.linear.float8"] and
                           [quantize.linear.float8] recipe_name ("rowwise" for fp8-rowwise),
                           enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp
                           (tensorwise under FSDP), filter_fqns = ["output"] (the head in BF16)
                    mxfp8: converters = ["quantize.linear.mx"], [quantize.linear.mx] recipe_name
                           "mxfp8_cublas", filter_fqns = ["output"] (torchtitan 0.2.2 job config)
    DeepSpeed       none: DeepSpeed has no FP8 training recipe of its own (FP8 there is
                    Transformer Engine modules inside the model code) — refused
"""
from __future__ import annotations

from autopar.export.common import Problem
from costmodels.contracts.errors import PlanError

MEGATRON = {"fp8": [("--fp8-format", "hybrid"), ("--fp8-recipe", "delayed")],
            "mxfp8": [("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")]}
FLOAT8 = "quantize.linear.float8"
MX = "quantize.linear.mx"


def problems(plan, target: str) -> list[Problem]:
    p = plan.precision
    if p == "bf16":
        return []
    if target == "megatron" and p == "fp8-rowwise":
        return [Problem("precision", p, "Megatron-LM has no rowwise FP8 recipe (tensorwise, delayed, "
                        "mxfp8, blockwise)", {"precision": "fp8"})]
    if target == "deepspeed":
        return [Problem("precision", p, "DeepSpeed has no FP8 training recipe of its own (FP8 there is "
                        "Transformer Engine modules in the model code)", {"precision": "bf16"})]
    return []


def megatron_args(plan) -> list:
    return list(MEGATRON.get(plan.precision, []))


def megatron_precision(flags: dict, who: str) -> str:
    """The plan precision of Megatron flags (``--fp8-format``, ``--fp8-recipe``)."""
    fmt, recipe = flags.get("fp8_format"), flags.get("fp8_recipe") or "delayed"
    if not fmt:
        return "bf16"
    if recipe == "mxfp8":
        return "mxfp8"
    if recipe in ("delayed", "tensorwise"):
        return "fp8"
    raise PlanError(f"{who} --fp8-recipe {recipe}: autopar plans per-tensor FP8 (delayed / tensorwise) "
                    "and mxfp8; use one of them or drop the FP8 flags")


def torchtitan_sections(plan) -> dict:
    """What an FP8 plan adds to the job config: ``{"converters": [...]}`` for [model] and its
    converter's own section by its dotted name (``[quantize.linear.float8]``)."""
    p = plan.precision
    if p == "bf16":
        return {}
    if p == "mxfp8":
        return {"converters": [MX], MX: {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}}
    fsdp = p == "fp8" and plan.zero >= 2 and plan.dp > 1
    f8 = {"enable_fsdp_float8_all_gather": fsdp, "precompute_float8_dynamic_scale_for_fsdp": fsdp,
          "filter_fqns": ["output"]}
    if p == "fp8-rowwise":
        f8["recipe_name"] = "rowwise"
    return {"converters": [FLOAT8], FLOAT8: f8}


def torchtitan_precision(doc: dict) -> str:
    """The plan precision of a torchtitan job config (its model converters)."""
    conv = doc.get("model", {}).get("converters", [])
    if isinstance(conv, str):
        conv = [c.strip() for c in conv.split(",") if c.strip()]
    linear = doc.get("quantize", {}).get("linear", {})
    if MX in conv or "mx" in conv:
        recipe = linear.get("mx", {}).get("recipe_name", "mxfp8_cublas")
        if not str(recipe).startswith("mxfp8"):
            raise PlanError(f"torchtitan quantize.linear.mx.recipe_name = {recipe!r}: autopar plans MXFP8 "
                            "only; use an mxfp8 recipe")
        return "mxfp8"
    if FLOAT8 in conv or "float8" in conv:
        recipe = linear.get("float8", {}).get("recipe_name") or "tensorwise"
        if recipe not in ("tensorwise", "rowwise"):
            raise PlanError(f"torchtitan quantize.linear.float8.recipe_name = {recipe!r}: autopar plans "
                            "tensorwise (fp8) and rowwise (fp8-rowwise)")
        return "fp8-rowwise" if recipe == "rowwise" else "fp8"
    return "bf16"
