"""The tensor-parallel overlap switches each target spells, carried by import and export.

autopar's runtime options ``megatron:tp_comm_overlap`` and ``fsdp:async_tp``
(``costmodels/model/tp_overlap.py``) are what these switches turn on:

    Megatron-LM        --tp-comm-overlap  (needs --sequence-parallel; Transformer Engine userbuffers)
    NeMo               model.ub_tp_comm_overlap: true  (the same userbuffers; read by
                       costmodels.calibration.dgxc_runs from the published yamls)
    torchtitan         parallelism.enable_async_tensor_parallel = true  (needs compile.enable)

Export writes the switch when the plan's runtime has the option (and the plan has tensor
parallelism); import adds the option to the runtime when the switch is on.
"""
from __future__ import annotations

OPTION = {"megatron": "tp_comm_overlap", "fsdp": "async_tp"}


def has_overlap(runtime: str | None) -> bool:
    """Whether a runtime name (``base:opt,opt``) switches TP overlap on."""
    base, _, opts = (runtime or "").partition(":")
    return OPTION.get(base) in [o.strip() for o in opts.split(",")]


def with_overlap(runtime: str) -> str:
    """``runtime`` with its TP-overlap option added (unchanged when it has it or has none)."""
    base, _, opts = runtime.partition(":")
    opt = OPTION.get(base)
    if opt is None or has_overlap(runtime):
        return runtime
    return f"{base}:{opts + ',' if opts else ''}{opt}"
