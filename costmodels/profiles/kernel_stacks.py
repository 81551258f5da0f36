"""Kernel stacks: the efficiency constants the cost model reads are per (GPU, software stack).

The same GPU runs the same matmuls and attention at different speeds under different software:
Transformer Engine's fused attention (cuDNN) on Hopper is about twice FlashAttention-2's rate,
its fused layer-norm + GEMM and bias + activation kernels move fewer bytes than Megatron-LM's of
2021, and torch's eager SDPA stack is neither. A hardware profile's fitted constants (its matmul
curve, ``attention_efficiency``) are those of the stack they were fitted on — for the shipped
GPU profiles, Composer's FSDP with FlashAttention-2 (``costmodels.calibration.open_runs``) —
so a runtime profile names the stack it runs (``kernel_stack = "transformer-engine"``, an option
may change it) and ``kernel_stacks.toml`` holds, per (GPU profile, stack), what differs::

    [[stack]]
    name = "transformer-engine"
    hardware = "h100-80g-sxm"
    matmul_scale = { value = 1.0, source = "..." }      # the profile's curve × this (capped at 1)
    attention_efficiency = { value = 0.7, source = "..." }   # fused attention forward, fraction
                                                        # of peak at the counted 4·b·s²·h FLOPs
    attention_bwd_ratio = { value = 3.0, source = "..." }    # its backward / forward time
    elementwise_bytes_per_saved_byte = { value = 1.4, source = "..." }  # replaces the runtime's
    optimizer_bandwidth_scale = { value = 1.0, source = "..." }  # optimizer step rate × this

Every figure is optional and carries its source. A (GPU, stack) pair without an entry — a
measured profile (``autopar profile`` measured the user's own stack), a GPU no open run of the
stack was published on — runs on the hardware profile's own constants, and ``stack_note`` says
so. ``stack_profile`` applies an entry (cached per profile object and stack: the search and
``estimate`` share it, so the search's objective stays ``estimate``'s step time).
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib

STACKS_FILE = Path(__file__).resolve().parent / "kernel_stacks.toml"
# figure -> (minimum, maximum): the attention figure may pass 1 (a causal kernel skips half the
# counted FLOPs), the ratio is a time ratio
FIGURES = {"matmul_scale": (0.2, 3.0), "attention_efficiency": (0.01, 2.0),
           "attention_bwd_ratio": (1.0, 6.0), "elementwise_bytes_per_saved_byte": (0.0, 100.0),
           "optimizer_bandwidth_scale": (0.05, 10.0)}


@lru_cache(maxsize=4)
def load_stacks(path: str = str(STACKS_FILE)) -> dict[tuple[str, str], dict]:
    """{(hardware, stack): {figure: (value, source)}} from the stacks file (empty if missing);
    ProfileError names a malformed entry."""
    p = Path(path)
    if not p.is_file():
        return {}
    with open(p, "rb") as f:
        data = tomllib.load(f)
    out: dict[tuple[str, str], dict] = {}
    for i, e in enumerate(data.get("stack", [])):
        where = f"kernel stacks '{p}': entry {i + 1}"
        for key in ("name", "hardware"):
            if not isinstance(e.get(key), str) or not e[key]:
                raise ProfileError(f"{where} field '{key}' is missing or not a string; fix the file")
        figs = {}
        for key, v in e.items():
            if key in ("name", "hardware", "description"):
                continue
            if key not in FIGURES:
                raise ProfileError(f"{where} field '{key}' is not one of {', '.join(FIGURES)}; fix the file")
            lo, hi = FIGURES[key]
            if (not isinstance(v, dict) or not isinstance(v.get("source"), str) or not v["source"].strip()
                    or isinstance(v.get("value"), bool) or not isinstance(v.get("value"), (int, float))
                    or not lo <= v["value"] <= hi):
                raise ProfileError(f"{where} field '{key}' must be {{ value = <{lo}..{hi}>, source = \"...\" }}; "
                                   "fix the file")
            figs[key] = (float(v["value"]), v["source"])
        out[(e["hardware"], e["name"])] = figs
    return out


def stack_figures(hardware: str, stack: str) -> dict | None:
    """The entry of (``hardware``, ``stack``), or None (the profile's own constants)."""
    if not stack:
        return None
    return load_stacks().get((hardware, stack))


@lru_cache(maxsize=256)
def stack_profile(profile, stack: str):
    """``profile`` with the constants of ``stack`` on it (module docstring); ``profile`` itself
    where there is no entry."""
    figs = stack_figures(profile.name, stack)
    if not figs:
        return profile
    kw = {}
    if "matmul_scale" in figs:
        kw["eff_values"] = tuple(min(1.0, e * figs["matmul_scale"][0]) for e in profile.eff_values)
    if "attention_efficiency" in figs:
        kw["attention_efficiency"] = figs["attention_efficiency"][0]
    if "attention_bwd_ratio" in figs:
        kw["attention_bwd_ratio"] = figs["attention_bwd_ratio"][0]
    if "optimizer_bandwidth_scale" in figs:
        kw["optimizer_bandwidth_bytes_per_s"] = profile.optimizer_bw * figs["optimizer_bandwidth_scale"][0]
    return dataclasses.replace(profile, **kw) if kw else profile


def stack_elementwise(profile, runtime) -> float | None:
    """The element-wise traffic (compute.C_FWD) of ``runtime``'s stack on ``profile``: the
    stack entry's figure, else the runtime profile's own (None: compute.C_FWD)."""
    figs = stack_figures(profile.name, runtime.kernel_stack)
    if figs and "elementwise_bytes_per_saved_byte" in figs:
        return figs["elementwise_bytes_per_saved_byte"][0]
    return runtime.elementwise_traffic


def stack_note(hardware: str, runtime) -> str:
    """One line: which constants a prediction of ``runtime`` on ``hardware`` uses."""
    stack = runtime.kernel_stack or "(unnamed)"
    if stack_figures(hardware, runtime.kernel_stack):
        return f"kernel stack {stack} on {hardware}: its own constants (kernel_stacks.toml)"
    return (f"kernel stack {stack} on {hardware}: no open run of this stack on this GPU; the hardware "
            "profile's own constants")
