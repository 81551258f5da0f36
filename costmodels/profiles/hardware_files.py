"""Hardware profiles as files: the shipped ones listed, a profile loaded by name or path (cached by
path and modification time), and a parsed TOML document checked field by field into a
``HardwareProfile``. The format itself is the ``costmodels.profiles.hardware`` docstring.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from costmodels.contracts.checks import is_int, quote
from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib
from costmodels.profiles.hardware import HardwareProfile, LinkTier
from costmodels.profiles.measured_sections import collectives_section, curve_section
from costmodels.profiles.profile_checks import check_known_fields, check_range, matmul_efficiency_section
from costmodels.profiles.shipped import shipped_dir

PROFILE_VERSION = 1
PROFILES_DIR = shipped_dir("hardware-profiles")


def list_profiles() -> list[str]:
    """Names of the shipped profiles (files in ``hardware-profiles/`` (package data)), sorted."""
    if not PROFILES_DIR.is_dir():
        return []
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


_CACHE: dict[tuple[str, float], HardwareProfile] = {}


def load_profile(name_or_path: str | os.PathLike | HardwareProfile) -> HardwareProfile:
    """A profile by shipped name (``h100-80g-sxm``) or by path to a TOML file."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    s = str(name_or_path)
    if len(s) > 4096 or "\0" in s:
        raise ProfileError(f"hardware profile {quote(s)} is not a profile name or a file path; pass a "
                           f"shipped name ({', '.join(list_profiles())}) or a path to a .toml file")
    path = Path(s)
    if not (s.endswith(".toml") or os.sep in s or path.is_file()):
        path = PROFILES_DIR / f"{s}.toml"
        if not path.is_file():
            import difflib
            names = list_profiles()
            close = difflib.get_close_matches(s, names, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ProfileError(f"unknown hardware profile {quote(s)}; {hint}shipped profiles: "
                               f"{', '.join(names) or '(none)'}, or pass a path to a .toml file")
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ProfileError(f"hardware profile file {quote(s)} {what}; pass a shipped name "
                           f"({', '.join(list_profiles())}) or a path to a .toml file")
    key = (str(path.resolve()), path.stat().st_mtime)
    if key in _CACHE:
        return _CACHE[key]
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"hardware profile {quote(str(path))} is not valid TOML ({e}); fix the file") from None
    except UnicodeDecodeError:
        raise ProfileError(f"hardware profile {quote(str(path))} is not a text file, so not a TOML "
                           "profile; pass a .toml profile (autopar hardware lists the shipped ones)") from None
    except RecursionError:
        raise ProfileError(f"hardware profile {quote(str(path))} nests its tables or arrays too deeply "
                           "to be a profile; fix the file (see the format in "
                           "costmodels/profiles/hardware.py)") from None
    except OSError as e:
        raise ProfileError(f"cannot read hardware profile {quote(str(path))} ({e.strerror}); check "
                           "the path and its permissions") from None
    prof = parse_profile(data, str(path))
    _CACHE[key] = prof
    return prof


def parse_profile(data: dict[str, Any], where: str = "<profile>") -> HardwareProfile:
    """Validate a parsed TOML document and build the profile: every field known
    (``costmodels.profiles.profile_checks.KNOWN``), every figure a cited, finite number in its plausible
    range (``RANGES``: a wrong unit falls outside it). ProfileError names the field."""
    sources: dict[str, str] = {}

    def err(fieldname: str, problem: str) -> ProfileError:
        return ProfileError(f"hardware profile {quote(where)}: field '{fieldname}' {problem}; "
                            "see the profile format in the costmodels/profiles/hardware.py docstring")

    def table(name: str) -> dict[str, Any]:
        t = data.get(name)
        if not isinstance(t, dict):
            raise err(name, "is missing or not a table")
        return t

    def figure(sect: dict[str, Any], sect_name: str, key: str, *, optional=False, range_key=None):
        full = f"{sect_name}.{key}"
        if key not in sect:
            if optional:
                return None
            raise err(full, "is missing (give it as { value = ..., source = \"...\" })")
        v = sect[key]
        if not isinstance(v, dict):
            raise err(full, f"must be an inline table {{ value = ..., source = \"...\" }}, got {quote(v)}")
        if "value" not in v:
            raise err(full + ".value", "is missing")
        if not isinstance(v.get("source"), str) or not v["source"].strip():
            raise err(full + ".source", "is missing or empty (every figure must cite where it comes from)")
        integer = key in ("gpus_per_node", "nics_per_node", "nvlink_domain_gpus")
        x = check_range(v["value"], full + ".value", range_key or key, err, integer=integer)
        sources[full] = v["source"]
        return int(x) if integer else x

    if not isinstance(data, dict):
        raise ProfileError(f"hardware profile {quote(where)} must be a table of fields, got "
                           f"{type(data).__name__}; see the profile format in the "
                           "costmodels/profiles/hardware.py docstring")
    version = data.get("version", PROFILE_VERSION)
    if not is_int(version) or version != PROFILE_VERSION:
        raise err("version", f"is {quote(version)}; this autopar reads version {PROFILE_VERSION}")
    check_known_fields(data, err)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise err("name", "is missing or not a string")
    desc = data.get("description", "")
    if not isinstance(desc, str):
        raise err("description", "must be a string")

    gpu = table("gpu")
    model = gpu.get("model", name)
    if not isinstance(model, str):
        raise err("gpu.model", "must be a string")
    bf16 = figure(gpu, "gpu", "peak_bf16_flops_per_s")
    fp16 = figure(gpu, "gpu", "peak_fp16_flops_per_s", optional=True) or bf16
    fp32 = figure(gpu, "gpu", "peak_fp32_flops_per_s")
    tf32 = figure(gpu, "gpu", "peak_tf32_flops_per_s", optional=True) or fp32
    hbm = figure(gpu, "gpu", "hbm_bytes")
    hbm_bw = figure(gpu, "gpu", "hbm_bandwidth_bytes_per_s")
    reserve = figure(gpu, "gpu", "memory_reserve_bytes")
    if reserve >= hbm:
        raise err("gpu.memory_reserve_bytes.value", f"({reserve:g}) must be smaller than gpu.hbm_bytes ({hbm:g})")
    fl, ev = matmul_efficiency_section(gpu.get("matmul_efficiency"), err, sources)
    elem_bw = figure(gpu, "gpu", "elementwise_bandwidth_bytes_per_s", optional=True)
    opt_bw = figure(gpu, "gpu", "optimizer_bandwidth_bytes_per_s", optional=True)
    attn_eff = figure(gpu, "gpu", "attention_efficiency", optional=True)
    ce = curve_section(gpu, "cross_entropy", ("logits", "logits_per_s"), err, sources)
    overlap = figure(gpu, "gpu", "comm_overlap", optional=True)
    fsdp_ov = figure(gpu, "gpu", "fsdp_overlap", optional=True)
    slowdown = figure(gpu, "gpu", "collective_slowdown", optional=True)
    low = {k: x for k in ("fp8", "mxfp8")
           if (x := figure(gpu, "gpu", f"peak_{k}_flops_per_s", optional=True)) is not None}
    scales = gpu.get("fp8_matmul_scale", {})
    if not isinstance(scales, dict):
        raise err("gpu.fp8_matmul_scale", "must be a table of runtime name = { value = ..., source = \"...\" }")
    fp8_scale = tuple((str(k), figure(scales, "gpu.fp8_matmul_scale", k, range_key="fp8_matmul_scale"))
                      for k in sorted(scales))
    node = table("node")
    gpn = figure(node, "node", "gpus_per_node")
    domain = figure(node, "node", "nvlink_domain_gpus", optional=True)
    if domain is not None and domain % gpn:
        raise err("node.nvlink_domain_gpus.value", f"({domain}) must be a multiple of node.gpus_per_node ({gpn})")
    tiers = []
    own, curves = collectives_section(data, err, sources)
    for tname in ("intra_node", "inter_node"):
        t = table(tname)
        inside = tname == "intra_node"
        tiers.append(LinkTier(tname, figure(t, tname, "bandwidth_bytes_per_s"), figure(t, tname, "latency_s"),
                              own if inside else (), curves if inside else ()))
    nics = figure(table("inter_node"), "inter_node", "nics_per_node", optional=True)
    return HardwareProfile(
        name=name, description=desc, gpu_model=model,
        peak_flops={"bf16": bf16, "fp16": fp16, "tf32": tf32, "fp32": fp32, **low},
        hbm_bytes=hbm, hbm_bandwidth_bytes_per_s=hbm_bw, memory_reserve_bytes=reserve,
        eff_flops=fl, eff_values=ev, gpus_per_node=gpn, intra_node=tiers[0], inter_node=tiers[1],
        path=where, sources=sources, elementwise_bandwidth_bytes_per_s=elem_bw,
        optimizer_bandwidth_bytes_per_s=opt_bw, attention_efficiency=attn_eff, ce_logits=ce[0],
        ce_rates=ce[1], comm_overlap=1.0 if overlap is None else overlap, fsdp_overlap=fsdp_ov,
        nics_per_node=nics, collective_slowdown=slowdown, fp8_matmul_scale=fp8_scale,
        nvlink_domain_gpus=domain)
