"""``autopar profile``: measure this machine and write a hardware profile (costmodels format).

``profile_machine(nproc, quick=False, progress=True) -> dict`` spawns ``nproc`` local ranks
(gloo on CPU, NCCL on GPU), each running ``profile_rank`` (what it measures and how:
``autopar.profile.measure`` and ``kernels``), and returns the raw measurements of rank 0 with
the other ranks' matmul / copy rates folded in. ``autopar.profile.build.build_profile`` turns
them into a profile (which measurement becomes which field: its docstring).

``output_path(output, name, nproc)`` is where ``autopar profile`` writes: ``-o``, else
``./<default_name>.toml`` in the current directory (never into the installed package, which may
be read-only or shared by other users). ``write_profile(path, text)`` validates the text with
``costmodels.profiles.hardware_files.parse_profile`` and writes it atomically (temporary file in the same
directory, then ``os.replace``).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
from pathlib import Path

from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib, write_text_atomic

__all__ = ["profile_machine", "profile_rank", "default_name", "output_path", "write_profile"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def default_name(nproc: int) -> str:
    import torch
    if torch.cuda.is_available():
        slug = "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name(0).lower())
        return f"{'-'.join(x for x in slug.split('-') if x)}-x{nproc}-measured"
    return f"cpu-{os.cpu_count()}core-{nproc}rank-measured"


def output_path(output: str | os.PathLike | None, name: str | None, nproc: int) -> tuple[Path, str]:
    """(file, profile name) ``autopar profile`` writes: ``output`` named by ``name`` or its
    stem; without ``output``, ``<name or default_name(nproc)>.toml`` in the current directory."""
    if output:
        out = Path(output)
        return out, name or out.stem
    name = name or default_name(nproc)
    return Path.cwd() / f"{name}.toml", name


def profile_machine(nproc: int | None = None, quick: bool = False, progress: bool = True,
                    clock: str = "wall") -> dict:
    """Spawn ``nproc`` ranks, measure (``profile_rank``), return the merged raw dict."""
    import torch

    from autopar.runtime.verify.serial import spawn
    cuda = torch.cuda.is_available()
    if nproc is None:
        nproc = torch.cuda.device_count() if cuda else (os.cpu_count() or 1)
    if nproc < 1:
        raise ProfileError(f"--nproc {nproc} must be at least 1")
    if cuda and nproc > torch.cuda.device_count():
        raise ProfileError(f"--nproc {nproc} but this machine has {torch.cuda.device_count()} GPUs; "
                           "profile with one rank per GPU")
    results = spawn(profile_rank, nproc, quick, progress, clock)
    raw = results[0]
    raw["nproc"] = nproc
    raw["cuda"] = cuda
    # fold in every rank's own compute / copy rates (mean), footprint (max)
    for dname, rows in raw["matmul"].items():
        for i, row in enumerate(rows):
            rates = [r["matmul"][dname][i][2] for r in results]
            row[2] = sum(rates) / len(rates)
            row.append(min(rates))
            row.append(max(rates))
    raw["copy"]["bytes_per_s_per_rank"] = [r["copy"]["bytes_per_s"] for r in results]
    raw["copy"]["bytes_per_s"] = sum(raw["copy"]["bytes_per_s_per_rank"]) / nproc
    for key, field in (("elementwise", "bytes_per_s"), ("attention", "flops_per_s"),
                       ("optimizer", "bytes_per_s")):
        if key in raw:
            vals = [r[key][field] for r in results]
            raw[key][field + "_per_rank"] = vals
            raw[key][field] = sum(vals) / len(vals)
    if "cross_entropy" in raw:   # mean over ranks, size by size
        for i, row in enumerate(raw["cross_entropy"]["rows"]):
            row[1] = sum(r["cross_entropy"]["rows"][i][1] for r in results) / len(results)
    raw["footprint_bytes_per_rank"] = [r["footprint_bytes"] for r in results]
    raw["footprint_bytes"] = max(raw["footprint_bytes_per_rank"])
    raw["host"] = socket.gethostname()
    raw["date"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    raw["cpu_model"] = _cpu_model()
    raw["mem_total_bytes"] = _mem_total()
    raw["gpus_per_node"] = torch.cuda.device_count() if cuda else nproc
    return raw


def collective_kinds(world_size: int) -> list[str]:
    """The collectives ``autopar profile`` measures on ``world_size`` ranks. None on one rank: a
    collective of one moves nothing, so its α-β fit has no bandwidth (it fit to 1e30 B/s, which
    the profile's own checks then refused, on a 1-GPU H100); the link tiers then fall back to the
    copy rate, said so in their sources (``build._link_tiers``)."""
    if world_size < 2:
        return []
    return ["all_reduce", "all_gather", "reduce_scatter", "all_gather_into_tensor",
            "reduce_scatter_tensor", "p2p"]


def profile_rank(quick: bool, progress: bool, clock: str = "wall") -> dict:
    """Everything one spawned rank measures (``autopar.profile.measure``'s docstring says how),
    as a plain dict. torch is imported here, in the rank, not when the CLI loads this module."""
    import warnings

    import torch
    import torch.distributed as dist

    from autopar.profile.measure import (
        DTYPES,
        ProgressBar,
        agreed_time,
        best_time,
        collective_fn,
        plan_sizes,
        rss_bytes,
    )
    warnings.filterwarnings("ignore", category=FutureWarning)
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sz = plan_sizes(device.type, quick)
    cpu_clock = clock == "cpu" and device.type == "cpu"
    colls = collective_kinds(n)
    total = (len(sz["dtypes"]) * len(sz["mm"]) + 2 + len(colls) * len(sz["coll"])
             + (n > 1) * (1 + len(colls) * len(sz["in_step"])))
    bar = ProgressBar(progress and rank == 0, total, "matmul")
    out: dict = {"rank": rank, "world_size": n, "device": device.type,
                 "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "backend": dist.get_backend(), "min_time_s": sz["min_time_s"],
                 "clock": "cpu" if cpu_clock else "wall"}
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(device)
        out["device_total_bytes"] = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.synchronize()
        free, tot = torch.cuda.mem_get_info(device)
        out["footprint_bytes"] = tot - free - torch.cuda.memory_allocated(device)
    else:
        out["footprint_bytes"] = rss_bytes()
    try:
        # ---- matmul -------------------------------------------------------------------
        mm: dict[str, list] = {}
        for dname in sz["dtypes"]:
            rows = []
            for nn in sz["mm"]:
                bar.step(f"matmul {dname} n={nn}")
                a = torch.randn(nn, nn, device=device).to(DTYPES[dname])
                b = torch.randn(nn, nn, device=device).to(DTYPES[dname])
                c = torch.empty(nn, nn, device=device, dtype=DTYPES[dname])
                dist.barrier()
                t, tc = best_time(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), device, sz["min_time_s"])
                rows.append([nn, 2.0 * nn ** 3, 2.0 * nn ** 3 / (tc if cpu_clock else t)])
                del a, b, c
            mm[dname] = rows
        out["matmul"] = mm
        # ---- memory bandwidth -----------------------------------------------------------
        bar.step("memory bandwidth")
        numel = sz["copy_bytes"] // 4
        src = torch.ones(numel, device=device)
        dst = torch.empty_like(src)
        dist.barrier()
        t, tc = best_time(lambda dst=dst, src=src: dst.copy_(src), device, max(sz["min_time_s"], 0.1))
        t = tc if cpu_clock else t
        out["copy"] = {"bytes": sz["copy_bytes"], "seconds": t, "bytes_per_s": 2.0 * sz["copy_bytes"] / t}
        del src, dst
        # ---- element-wise, attention, optimizer (autopar.profile.kernels) -------------------
        from autopar.profile import kernels
        from costmodels.model.optimizer import OPTIMIZER_BYTES_PER_PARAM
        bar.step("element-wise, attention, optimizer")
        dist.barrier()
        kt = max(sz["min_time_s"], 0.1)
        out["elementwise"] = kernels.elementwise_rate(device, kt, cpu_clock)
        out["attention"] = kernels.attention_rate(device, kt, cpu_clock)
        out["cross_entropy"] = kernels.cross_entropy_rate(device, kt, cpu_clock)
        out["optimizer"] = kernels.optimizer_rate(device, kt, cpu_clock, OPTIMIZER_BYTES_PER_PARAM)
        # ---- collectives ------------------------------------------------------------------
        coll: dict[str, list] = {}
        for kind in colls:
            rows = []
            for S in sz["coll"]:
                bar.step(f"{kind} {S} B")
                S = max(S - S % (4 * n), 4 * n)  # whole fp32 elements, divisible by n
                fn = collective_fn(kind, S, rank, n, device)
                dist.barrier()
                t = agreed_time(fn, device, sz["min_time_s"], rank, n, p2p=kind == "p2p")
                rows.append([S, t / 2.0 if kind == "p2p" else t])  # p2p: round trip -> one way
            coll[kind] = rows
        out["collectives"] = coll
        from autopar.profile.kernels import fsdp_reduce_fns, fsdp_unshard_fn, in_step_time
        in_step: dict[str, list] = {}
        for kind in colls if n > 1 else ():
            b2b = dict((r[0], r[1]) for r in coll[kind])
            rows = []
            for S in sz["in_step"]:
                bar.step(f"{kind} {S} B between compute")
                S = max(S - S % (4 * n), 4 * n)
                base = None
                if kind == "all_gather_into_tensor":   # as FSDP2 issues them (kernels docstring)
                    fn = fsdp_unshard_fn(S, device, n)
                elif kind == "reduce_scatter_tensor":
                    fn, base = fsdp_reduce_fns(S, device, n)
                else:
                    fn = collective_fn(kind, S, rank, n, device)
                half = 2.0 if kind == "p2p" else 1.0
                t = in_step_time(fn, device, b2b.get(S, 0.0) * half, base=base) / half
                rows.append([S, t])
            in_step[kind] = rows
        out["in_step"] = in_step
        if n > 1:
            bar.step("comm / compute overlap")
            out["overlap"] = kernels.comm_overlap(device)
    finally:
        bar.close()
    return out


def write_profile(path: str | os.PathLike, text: str) -> Path:
    """Validate ``text`` as a profile, then write it to ``path`` atomically."""
    from costmodels.profiles.hardware_files import parse_profile
    path = Path(path)
    parse_profile(tomllib.loads(text), str(path))
    write_text_atomic(path, text)
    return path
