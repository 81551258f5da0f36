"""What a hardware profile may hold: its known fields and each figure's plausible range.

Why: a profile is typed by hand or measured, and both go wrong in ways the arithmetic does not
notice. A peak given in TFLOP/s (``312`` instead of ``312e12``) made every step take 9e5 s, a
bandwidth in GB/s made communication a million times slower, ``5e-324`` FLOP/s gave inf and NaN
step times, and a misspelt optional field (``comm_overlapp``) was silently ignored. So each figure
has a range wide enough for any GPU or CPU host (CPU ranks included, as ``autopar profile``
measures them) and narrow enough that a wrong unit falls outside it, and a field the format does
not know is refused with the nearest known name. ``costmodels.profiles.hardware_files.parse_profile`` reads
through these; ``costmodels.profiles.measured_sections`` uses ``RANGES`` for its measured points.
"""
from __future__ import annotations

from typing import Any

from costmodels.contracts.checks import LIMITS, is_number, nearest, quote

# field -> (low, high, low bound included, unit and example: what a wrong unit looks like)
_FLOPS = (1e9, 1e17, False, "FLOP/s, e.g. 312e12 for an A100's bf16 (not TFLOP/s)")
_MEM_BW = (1e9, 1e14, False, "bytes per second, e.g. 2.039e12 (not GB/s)")
_KERNEL_BW = (1e8, 1e14, False, "bytes per second, e.g. 1.5e12 (not GB/s)")
_SHARE = (0.0, 1.0, True, "a fraction from 0 to 1")
RANGES: dict[str, tuple[float, float, bool, str]] = {
    "peak_bf16_flops_per_s": _FLOPS, "peak_fp16_flops_per_s": _FLOPS,
    "peak_tf32_flops_per_s": _FLOPS, "peak_fp32_flops_per_s": _FLOPS,
    "peak_fp8_flops_per_s": _FLOPS, "peak_mxfp8_flops_per_s": _FLOPS,
    "fp8_matmul_scale": (0.05, 2.0, True, "a factor on the FP8 matmul efficiency, e.g. 0.8"),
    "nvlink_domain_gpus": (1, 1024, True, "GPUs in one NVLink domain, an integer"),
    "hbm_bytes": (1e9, 1e13, True, "bytes of memory per GPU, e.g. 80e9 (not GB)"),
    "hbm_bandwidth_bytes_per_s": _MEM_BW,
    "memory_reserve_bytes": (0.0, 1e13, True, "bytes, e.g. 3e9 (not GB)"),
    "elementwise_bandwidth_bytes_per_s": _KERNEL_BW, "optimizer_bandwidth_bytes_per_s": _KERNEL_BW,
    "attention_efficiency": (1e-4, 1.0, True, "a fraction of peak from 1e-4 to 1"),
    "efficiency": (1e-4, 1.0, True, "a fraction of peak from 1e-4 to 1 (a matmul at 0.01% of peak is a unit error)"),
    "comm_overlap": _SHARE, "fsdp_overlap": _SHARE, "collective_slowdown": _SHARE,
    "gpus_per_node": (1, 1024, True, "GPUs (processes) per node, an integer"),
    "nics_per_node": (1, 1024, True, "network interfaces per node, an integer"),
    "bandwidth_bytes_per_s": (1e6, 1e13, False, "bytes per second per GPU, e.g. 230e9 (not GB/s or Gbit/s)"),
    "latency_s": (0.0, 1.0, True, "seconds per collective step, e.g. 5e-6 (not microseconds)"),
    # measured sections (costmodels.profiles.measured_sections)
    "alpha_s": (0.0, 1.0, True, "seconds, e.g. 2e-5 (not microseconds)"),
    "beta_bytes_per_s": (1e5, 1e13, False, "bytes per second, e.g. 1.3e9 (not GB/s)"),
    "ranks": (2, LIMITS["gpus"], True, "ranks measured, an integer"),
    "matmul_flops": (1.0, 1e20, True, "FLOPs of one matmul (2·m·n·k)"),
    "bytes": (1.0, 1e13, True, "bytes per collective call"),
    "seconds": (0.0, 1e3, False, "seconds per collective call"),
    "logits": (1.0, 1e15, True, "logits per call"),
    "logits_per_s": (1.0, 1e16, False, "logits per second"),
}
MAX_POINTS = 1000          # entries of one measured list

FIGURE_KEYS = ("value", "source")
_COLLECTIVE = ("ranks", "bytes", "seconds", "bus_bandwidth_bytes_per_s", "alpha_s", "beta_bytes_per_s",
               "fit_median_rel_error", "fit_max_rel_error", "source", "in_step_bytes", "in_step_seconds",
               "in_step_alpha_s", "in_step_beta_bytes_per_s", "in_step_fit_median_rel_error",
               "in_step_fit_max_rel_error", "in_step_source")
# table path -> the keys it may hold ("*" : any name, checked by the table's own reader)
KNOWN: dict[str, tuple[str, ...]] = {
    "": ("version", "name", "description", "gpu", "node", "intra_node", "inter_node", "collectives"),
    "gpu": ("model", "peak_bf16_flops_per_s", "peak_fp16_flops_per_s", "peak_tf32_flops_per_s",
            "peak_fp32_flops_per_s", "hbm_bytes", "hbm_bandwidth_bytes_per_s", "memory_reserve_bytes",
            "matmul_efficiency", "elementwise_bandwidth_bytes_per_s", "optimizer_bandwidth_bytes_per_s",
            "attention_efficiency", "cross_entropy", "comm_overlap", "fsdp_overlap",
            "collective_slowdown", "peak_fp8_flops_per_s", "peak_mxfp8_flops_per_s", "fp8_matmul_scale"),
    "gpu.fp8_matmul_scale": ("*",),
    "gpu.matmul_efficiency": ("flops", "efficiency", "source"),
    "gpu.cross_entropy": ("logits", "logits_per_s", "source"),
    "node": ("gpus_per_node", "nvlink_domain_gpus"),
    "intra_node": ("bandwidth_bytes_per_s", "latency_s"),
    "inter_node": ("bandwidth_bytes_per_s", "latency_s", "nics_per_node"),
    "collectives": ("*",),
    "collectives.*": _COLLECTIVE,
}


def check_known_fields(data: dict[str, Any], err) -> None:
    """Every key of the document, its tables and its figures must be one the format knows;
    ``err(field, problem)`` is ``parse_profile``'s ProfileError factory."""
    _check_table(data, "", err)


def _check_table(table: dict, path: str, err) -> None:
    known = KNOWN["collectives.*" if path.startswith("collectives.") else path]
    for key, value in table.items():
        full = f"{path}.{key}" if path else str(key)
        if "*" not in known and key not in known:
            raise err(quote(full, 60).strip("'"), f"is not a profile field; {nearest(key, known)}"
                      f"known here: {', '.join(known)}")
        if not isinstance(value, dict):
            continue
        sub = "collectives.*" if path == "collectives" else full
        if sub in KNOWN:
            _check_table(value, full, err)
            continue
        for k in value:                                    # a figure's inline table
            if k not in FIGURE_KEYS:
                raise err(f"{full}.{quote(k, 40).strip(chr(39))}", "is not part of a figure; a figure "
                          "is { value = <number>, source = \"<where it comes from>\" }")


def check_range(x: Any, field: str, key: str, err, *, integer: bool = False) -> float:
    """``x`` (a figure's value or a measured number) in ``RANGES[key]``, else ``err`` naming the
    field, the range and the unit (most out-of-range figures are in the wrong unit)."""
    low, high, low_ok, unit = RANGES[key]
    if not is_number(x):
        raise err(field, f"must be a finite number, got {quote(x)}")
    if integer and not float(x).is_integer():
        raise err(field, f"must be an integer, got {quote(x)}")
    if x > high or x < low or (x == low and not low_ok):
        bound = f"from {_g(low)} to {_g(high)}" if low_ok else f"above {_g(low)} and at most {_g(high)}"
        raise err(field, f"= {_g(x)} is implausible: it must be {bound}, in {unit}")
    return float(x)


def _g(x: float) -> str:
    """A number as people write it in a profile: 1e9, 2.5e-6, 312."""
    return f"{x:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def check_points(xs: Any, key: str, field: str, err) -> None:
    """A measured list: 1 to MAX_POINTS numbers, each in ``RANGES[key]``."""
    if not isinstance(xs, list) or not xs or len(xs) > MAX_POINTS:
        raise err(field, f"must be a non-empty list of at most {MAX_POINTS} positive numbers")
    for x in xs:
        check_range(x, field, key, err)


def matmul_efficiency_section(eff: Any, err, sources: dict[str, str]) -> tuple[tuple, tuple]:
    """``[gpu.matmul_efficiency]``: strictly increasing matmul sizes, one efficiency in (0, 1]
    each, and a source."""
    if not isinstance(eff, dict):
        raise err("gpu.matmul_efficiency",
                  "is missing or not a table (flops = [...], efficiency = [...], source = \"...\")")
    fl, ev = eff.get("flops"), eff.get("efficiency")
    check_points(fl, "matmul_flops", "gpu.matmul_efficiency.flops", err)
    if any(b <= a for a, b in zip(fl, fl[1:])):
        raise err("gpu.matmul_efficiency.flops", "must be strictly increasing")
    if not isinstance(ev, list) or len(ev) != len(fl):
        raise err("gpu.matmul_efficiency.efficiency", f"must be a list of {len(fl)} numbers (one per flops entry)")
    for x in ev:
        check_range(x, "gpu.matmul_efficiency.efficiency", "efficiency", err)
    if not isinstance(eff.get("source"), str) or not eff["source"].strip():
        raise err("gpu.matmul_efficiency.source", "is missing or empty")
    sources["gpu.matmul_efficiency"] = eff["source"]
    return tuple(float(x) for x in fl), tuple(float(x) for x in ev)
