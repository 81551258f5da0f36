"""``autopar profile``: measure this machine and write a hardware profile (costmodels format).

``profile_machine(nproc, quick=False, progress=True) -> dict`` spawns ``nproc`` local ranks
(gloo on CPU, NCCL on GPU; see ``autopar.profile.measure`` for what each measures and how) and
returns the raw measurements of rank 0 with the other ranks' matmul / copy rates folded in.
``build_profile(raw, name) -> (toml_text, summary)`` turns them into a profile:

==================================== ========================================================
profile field                         from
==================================== ========================================================
gpu.peak_bf16/fp16/fp32_flops_per_s  the best square-matmul rate of that dtype over the sizes,
                                      mean over ranks (all ranks busy at once)
gpu.matmul_efficiency                 bf16 rate at each size / peak bf16, FLOPs = 2·n³
gpu.hbm_bandwidth_bytes_per_s         copy_ of a large fp32 buffer, 2·bytes / time, mean over ranks
gpu.hbm_bytes                         GPU: device memory; CPU: MemTotal / nproc (one rank's share)
gpu.memory_reserve_bytes              a rank's footprint before any model (CPU: VmRSS after
                                      importing torch and joining gloo; GPU: CUDA memory in use
                                      that torch's allocator did not hand out)
node.gpus_per_node                    nproc (CPU) / torch.cuda.device_count() (GPU)
intra_node.latency_s / bandwidth      ONE α-β fit over all collectives' (size, time) points
                                      (``autopar.profile.fit.fit_joint``) — the tier's α-β, for
                                      a collective without its own fit
inter_node.*                          not measurable on one host: the intra-node fit, said so
[collectives.<kind>]                  per collective: the measured sizes, times and nccl-tests
                                      bus bandwidths and its own α-β fit; then its time *in a
                                      step* (between compute, ``kernels.in_step_time``) at a few
                                      sizes and their α-β fit (``in_step_*``): inside a node the
                                      cost model interpolates those points for a group of the
                                      measured size, and uses the in-step α-β otherwise
gpu.elementwise / optimizer / ...     ``autopar.profile.kernels`` (element-wise and optimizer
                                      bandwidth, attention efficiency, cross-entropy curve,
                                      comm overlap)
==================================== ========================================================

``write_profile(path, text)`` validates the text with ``costmodels.hardware.parse_profile`` and
writes it atomically (temporary file in the same directory, then ``os.replace``).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import tomllib
from pathlib import Path

from costmodels.errors import ProfileError
from costmodels.files import write_text_atomic

from autopar.profile.fit import AlphaBeta, bus_bandwidth, fit_alpha_beta, fit_joint

__all__ = ["profile_machine", "build_profile", "write_profile", "default_name", "AlphaBeta",
           "fit_alpha_beta", "fit_joint", "bus_bandwidth"]


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


def _rank_entry(quick: bool, progress: bool, clock: str = "wall"):
    from autopar.profile.measure import profile_rank
    return profile_rank(quick, progress, clock)


def profile_machine(nproc: int | None = None, quick: bool = False, progress: bool = True,
                    clock: str = "wall") -> dict:
    """Spawn ``nproc`` ranks, measure (``measure.profile_rank``), return the merged raw dict."""
    import torch

    from autopar.runtime.verify import spawn
    cuda = torch.cuda.is_available()
    if nproc is None:
        nproc = torch.cuda.device_count() if cuda else (os.cpu_count() or 1)
    if nproc < 1:
        raise ProfileError(f"--nproc {nproc} must be at least 1")
    if cuda and nproc > torch.cuda.device_count():
        raise ProfileError(f"--nproc {nproc} but this machine has {torch.cuda.device_count()} GPUs; "
                           "profile with one rank per GPU")
    results = spawn(_rank_entry, nproc, quick, progress, clock)
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


def _g(x: float) -> str:
    """A TOML float that round-trips (repr of a Python float is valid TOML)."""
    x = float(x)
    return repr(x) if x == x and x not in (float("inf"), float("-inf")) else "0.0"


def _s(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fits(raw: dict) -> dict[str, AlphaBeta]:
    """Per-collective α-β fits and the joint one (key 'joint') from the raw measurements."""
    n = raw["world_size"]
    out: dict[str, AlphaBeta] = {}
    series = []
    for kind, rows in raw.get("collectives", {}).items():
        sizes = [r[0] for r in rows]
        times = [r[1] for r in rows]
        out[kind] = fit_alpha_beta(kind, n, sizes, times)
        series.append((kind, n, sizes, times))
    if series:
        out["joint"] = fit_joint(series)
    return out


def in_step_fits(raw: dict) -> dict[str, AlphaBeta]:
    """Per-collective α-β fits of the in-step times (``kernels.in_step_time``), if measured."""
    n = raw["world_size"]
    return {kind: fit_alpha_beta(kind, n, [r[0] for r in rows], [r[1] for r in rows])
            for kind, rows in raw.get("in_step", {}).items() if rows}


def _kernel_figures(raw: dict, peak_bf16: float) -> list[tuple[str, str, str]]:
    """(field, value, how measured) of the optional rates (autopar.profile.kernels)."""
    out = []
    if "elementwise" in raw:
        ew, at, op = raw["elementwise"], raw["attention"], raw["optimizer"]
        out.append(("elementwise_bandwidth_bytes_per_s", _g(ew["bytes_per_s"]),
                    "layer_norm + gelu + add + fp32 cast + log_softmax forward and backward on 2^20 bf16 "
                    "elements, bytes of every aten op's tensors counted (autopar/profile/kernels.py),"))
        out.append(("optimizer_bandwidth_bytes_per_s", _g(op["bytes_per_s"]),
                    f"torch.optim.AdamW(lr=1e-4).step over {op['params']} fp32 parameters "
                    "(4 x 2^21 + 16 x 2^16), 40 bytes per parameter / time,"))
        out.append(("attention_efficiency", f"{min(1.0, at['flops_per_s'] / peak_bf16):.4f}",
                    "causal scaled_dot_product_attention bf16 forward + backward, B*H = 8, D = 64, "
                    "S = 256 and 512, 12*B*S^2*H*D FLOPs / time / peak bf16,"))
    if "overlap" in raw:
        ov = raw["overlap"]
        out.append(("comm_overlap", f"{ov['overlap']:.4f}",
                    f"{ov['all_reduces']} async all-reduces of {ov['bytes']} B alone {ov['comm_s']:.4f} s, "
                    f"matmuls alone {ov['compute_s']:.4f} s, both at once {ov['both_s']:.4f} s: "
                    "(alone + alone - both) / min(alone), slowest rank,"))
    return out


def build_profile(raw: dict, name: str) -> tuple[str, dict]:
    """(TOML text, summary dict) of a profile from ``profile_machine``'s measurements."""
    n = raw["nproc"]
    cuda = raw["cuda"]
    how = f"measured by autopar profile on {raw['host']}, {raw['date']}"
    who = (f"{n} ranks on {raw.get('device_name', 'GPU')}, NCCL" if cuda else
           f"{n} ranks x {raw['threads']} thread on the CPU, gloo, all ranks at once, best of 5 runs, "
           + ("timed by thread CPU time" if raw.get("clock") == "cpu" else "wall clock"))
    mm = raw["matmul"]
    peak = {d: max(r[2] for r in rows) for d, rows in mm.items()}
    best_n = {d: max(rows, key=lambda r: r[2])[0] for d, rows in mm.items()}
    bf = sorted(mm["bf16"], key=lambda r: r[1])
    eff_f = [r[1] for r in bf]
    eff_v = [min(1.0, max(1e-4, r[2] / peak["bf16"])) for r in bf]
    F = fits(raw)
    hbm = raw["device_total_bytes"] if cuda else raw["mem_total_bytes"] / n
    reserve = raw["footprint_bytes"]
    model = raw.get("device_name") if cuda else f"{raw['cpu_model']}, 1 of {n} ranks, torch CPU"
    L = []
    L.append(f"# Measured by `autopar profile --nproc {n}{' --quick' if raw.get('quick') else ''}` "
             f"({raw['date']}, torch {raw['torch']}, {raw['backend']}).")
    L.append("# Every rank measured at the same time; one 'gpu' here is one rank"
             + ("." if cuda else " (one process, one thread, one core)."))
    L.append("# Format: costmodels/hardware.py. Method: autopar/profile/__init__.py and measure.py.")
    L.append("version = 1")
    L.append(f"name = {_s(name)}")
    L.append(f"description = {_s(('GPU ' if cuda else 'CPU host, ') + model + f', {n} ranks measured by autopar profile')}")
    L.append("")
    L.append("[gpu]")
    L.append(f"model = {_s(model)}")
    for d, key in (("bf16", "peak_bf16_flops_per_s"), ("fp16", "peak_fp16_flops_per_s"),
                   ("fp32", "peak_fp32_flops_per_s")):
        if d in peak:
            L.append(f"{key} = {{ value = {_g(peak[d])}, source = {_s(f'{how}: best torch.matmul {d} square n={best_n[d]} per rank ({who}), mean over ranks')} }}")
    hbm_src = ("torch.cuda.get_device_properties().total_memory" if cuda
               else f"MemTotal {raw['mem_total_bytes']} B / {n} ranks (one rank's share)")
    L.append(f"hbm_bytes = {{ value = {_g(hbm)}, source = {_s(how + ': ' + hbm_src)} }}")
    cp = raw["copy"]
    copy_mib = cp["bytes"] >> 20
    L.append(f"hbm_bandwidth_bytes_per_s = {{ value = {_g(cp['bytes_per_s'])}, source = "
             f"{_s(f'{how}: tensor.copy_ of {copy_mib} MiB fp32, 2*bytes/time per rank ({who}), mean over ranks')} }}")
    for key, value, what in _kernel_figures(raw, peak["bf16"]):
        tail = (f"{n} ranks, wall clock, median of 5 paired runs" if key == "comm_overlap"
                else f"per rank ({who}), mean over ranks")
        L.append(f"{key} = {{ value = {value}, source = {_s(f'{how}: {what} {tail}')} }}")
    if not cuda and n > 1:
        why = (f"{how}: not measured, a fact of torch {raw['torch']}: FSDP2 (ZeRO-2/3) hides its "
               "all-gathers and reduce-scatters only on separate device streams "
               "(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, get_all_gather_streams); "
               "a CPU has none, so they run in line")
        L.append(f"fsdp_overlap = {{ value = 0.0, source = {_s(why)} }}")
    res_src = ("CUDA memory in use not allocated by tensors after NCCL init (context, NCCL), max over ranks"
               if cuda else "VmRSS of a rank after importing torch and joining the gloo group, before "
               "any model (Python + torch + gloo), max over ranks")
    L.append(f"memory_reserve_bytes = {{ value = {_g(reserve)}, source = {_s(how + ': ' + res_src)} }}")
    L.append("")
    L.append("[gpu.matmul_efficiency]")
    L.append("flops = [" + ", ".join(_g(x) for x in eff_f) + "]")
    L.append("efficiency = [" + ", ".join(f"{x:.4f}" for x in eff_v) + "]")
    L.append(f"source = {_s(f'{how}: torch.matmul bf16 square n=' + ','.join(str(r[0]) for r in bf) + f' (2*n^3 FLOPs) per rank ({who}), achieved / peak bf16')}")
    if "cross_entropy" in raw:
        ce = raw["cross_entropy"]
        vocab = ce["vocab"]
        L.append("")
        L.append("[gpu.cross_entropy]")
        L.append("logits = [" + ", ".join(_g(r[0]) for r in ce["rows"]) + "]")
        L.append("logits_per_s = [" + ", ".join(_g(r[1]) for r in ce["rows"]) + "]")
        L.append(f"source = {_s(f'{how}: F.cross_entropy(logits.float(), targets) forward + backward on bf16 logits, vocabulary {vocab}, logits per call / time, per rank ({who}), mean over ranks')}")
    L.append("")
    L.append("[node]")
    L.append(f"gpus_per_node = {{ value = {raw['gpus_per_node']}, source = {_s(how + (': torch.cuda.device_count()' if cuda else f': --nproc {n} ranks on this host'))} }}")
    if "joint" in F:
        j = F["joint"]
        sizes = sorted({r[0] for rows in raw["collectives"].values() for r in rows})
        fit_src = (f"{how}: one alpha-beta least-squares fit (relative error) over the times of every "
                   f"collective measured (see [collectives.*]; inside a node each uses its own fit), "
                   f"{sizes[0]}..{sizes[-1]} B fp32 buffers, {n} ranks, "
                   f"{raw['backend']}; median / max fit error {j.median_rel_error:.0%} / {j.max_rel_error:.0%}")
        tiers = {"intra_node": (j.beta_bytes_per_s, j.alpha_s, fit_src),
                 "inter_node": (j.beta_bytes_per_s, j.alpha_s,
                                "no second host to measure: set to the intra-node fit (assumption); " + fit_src)}
    else:
        bw = cp["bytes_per_s"]
        s = f"{how}: one rank, no collective to measure; bandwidth set to the copy bandwidth, latency 0 (assumption)"
        tiers = {"intra_node": (bw, 0.0, s), "inter_node": (bw, 0.0, s)}
    for t, (bw, lat, src) in tiers.items():
        L.append("")
        L.append(f"[{t}]")
        L.append(f"bandwidth_bytes_per_s = {{ value = {_g(bw)}, source = {_s(src)} }}")
        L.append(f"latency_s = {{ value = {_g(lat)}, source = {_s(src)} }}")
    IS = in_step_fits(raw)
    for kind, rows in raw.get("collectives", {}).items():
        f = F[kind]
        L.append("")
        L.append(f"[collectives.{kind}]   # measured; inside a node the cost model uses the "
                 + ("in-step points (their alpha-beta for other group sizes)" if kind in IS
                    else "alpha-beta"))
        L.append(f"ranks = {2 if kind == 'p2p' else n}")   # p2p: between ranks 0 and 1
        L.append("bytes = [" + ", ".join(str(int(r[0])) for r in rows) + "]")
        L.append("seconds = [" + ", ".join(f"{r[1]:.6g}" for r in rows) + "]")
        busbw = bus_bandwidth(kind, [r[0] for r in rows], n, [r[1] for r in rows])
        L.append("bus_bandwidth_bytes_per_s = [" + ", ".join(f"{x:.6g}" for x in busbw) + "]")
        L.append(f"alpha_s = {_g(f.alpha_s)}")
        L.append(f"beta_bytes_per_s = {_g(f.beta_bytes_per_s)}")
        L.append(f"fit_median_rel_error = {f.median_rel_error:.4f}")
        L.append(f"fit_max_rel_error = {f.max_rel_error:.4f}")
        L.append(f"source = {_s(f'{how}: {kind} of fp32 buffers (nccl-tests size convention, busbw = algbw * bus factor), slowest rank, median of 5 runs, least-squares alpha-beta in relative error')}")
        if kind in IS:
            g, rows_is = IS[kind], raw["in_step"][kind]
            L.append("in_step_bytes = [" + ", ".join(str(int(r[0])) for r in rows_is) + "]")
            L.append("in_step_seconds = [" + ", ".join(f"{r[1]:.6g}" for r in rows_is) + "]")
            L.append(f"in_step_alpha_s = {_g(g.alpha_s)}")
            L.append(f"in_step_beta_bytes_per_s = {_g(g.beta_bytes_per_s)}")
            L.append(f"in_step_fit_median_rel_error = {g.median_rel_error:.4f}")
            L.append(f"in_step_fit_max_rel_error = {g.max_rel_error:.4f}")
            L.append(f"in_step_source = {_s(f'{how}: the same {kind} issued between ~5 ms (CPU) / 1 ms (GPU) of matmuls, time added per call (loop with it minus loop without, 8 calls, slowest rank, median of 5 pairs, at least the back-to-back time; autopar/profile/kernels.py in_step_time), least-squares alpha-beta in relative error')}")
    text = "\n".join(L) + "\n"
    summary = {"name": name, "peak_flops_per_s": peak, "hbm_bandwidth_bytes_per_s": cp["bytes_per_s"],
               "hbm_bytes": hbm, "memory_reserve_bytes": reserve,
               "matmul_efficiency": {"flops": eff_f, "efficiency": eff_v},
               "collectives": {k: _fit_summary(v) for k, v in F.items()},
               "in_step": {k: _fit_summary(v) for k, v in IS.items()}}
    return text, summary


def _fit_summary(fit) -> dict:
    return {"alpha_s": fit.alpha_s, "beta_bytes_per_s": fit.beta_bytes_per_s,
            "median_rel_error": fit.median_rel_error, "max_rel_error": fit.max_rel_error}


def write_profile(path: str | os.PathLike, text: str) -> Path:
    """Validate ``text`` as a profile, then write it to ``path`` atomically."""
    from costmodels.hardware import parse_profile
    path = Path(path)
    parse_profile(tomllib.loads(text), str(path))
    write_text_atomic(path, text)
    return path
