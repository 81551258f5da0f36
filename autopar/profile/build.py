"""From ``autopar profile``'s raw measurements to a hardware profile (no torch here).

``build_profile(raw, name) -> (toml_text, summary)`` builds the profile as a plain dict, the
document ``costmodels.profiles.hardware_files.parse_profile`` reads, and has
``costmodels.profiles.profile_format.dump_profile`` write it: the format is costmodels', this module
only decides which measurement becomes which figure and how its ``source`` describes it.

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

Figures written rounded (the attention efficiency, overlap and matmul efficiencies to 4
decimals, measured seconds and bus bandwidths to 6 significant digits) are rounded here, in the
dict, so the file holds exactly the document built.
"""
from __future__ import annotations

from autopar.profile.fit import AlphaBeta, bus_bandwidth, fit_alpha_beta, fit_joint
from costmodels.profiles.profile_format import dump_profile

__all__ = ["build_profile", "fits", "in_step_fits"]


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


def _six_digits(x) -> float:
    """``x`` to 6 significant digits: measured times and bandwidths, noisy beyond that."""
    return float(f"{float(x):.6g}")


def _figure(value, source: str) -> dict:
    return {"value": value, "source": source}


class _Context:
    """What every source string repeats: when, where and how the ranks were measured."""

    def __init__(self, raw: dict):
        self.n, self.cuda = raw["nproc"], raw["cuda"]
        self.how = f"measured by autopar profile on {raw['host']}, {raw['date']}"
        self.who = (f"{self.n} ranks on {raw.get('device_name', 'GPU')}, NCCL" if self.cuda else
                    f"{self.n} ranks x {raw['threads']} thread on the CPU, gloo, all ranks at once, "
                    "best of 5 runs, "
                    + ("timed by thread CPU time" if raw.get("clock") == "cpu" else "wall clock"))
        self.per_rank = f"per rank ({self.who}), mean over ranks"


def _kernel_figures(raw: dict, peak_bf16: float, c: _Context) -> dict[str, dict]:
    """The optional rates (autopar.profile.kernels), as ``[gpu]`` figures."""
    out = {}
    if "elementwise" in raw:
        ew, at, op = raw["elementwise"], raw["attention"], raw["optimizer"]
        out["elementwise_bandwidth_bytes_per_s"] = _figure(float(ew["bytes_per_s"]), (
            f"{c.how}: layer_norm + gelu + add + fp32 cast + log_softmax forward and backward on "
            + ("2^26" if c.cuda else "2^20") + " bf16 elements, bytes of every aten op's tensors counted "
            f"(autopar/profile/kernels.py), {c.per_rank}"))
        out["optimizer_bandwidth_bytes_per_s"] = _figure(float(op["bytes_per_s"]), (
            f"{c.how}: torch.optim.AdamW(lr=1e-4).step over {op['params']} fp32 parameters "
            f"(4 x 2^21 + 16 x 2^16), 40 bytes per parameter / time, {c.per_rank}"))
        out["attention_efficiency"] = _figure(round(min(1.0, at["flops_per_s"] / peak_bf16), 4), (
            f"{c.how}: causal scaled_dot_product_attention bf16 forward + backward, "
            + ("B*H = 32, D = 128, S = 2048 and 4096" if c.cuda else "B*H = 8, D = 64, S = 256 and 512")
            + f", 12*B*S^2*H*D FLOPs / time / peak bf16, {c.per_rank}"))
    if "overlap" in raw:
        ov = raw["overlap"]
        out["comm_overlap"] = _figure(round(ov["overlap"], 4), (
            f"{c.how}: {ov['all_reduces']} async all-reduces of {ov['bytes']} B alone "
            f"{ov['comm_s']:.4f} s, matmuls alone {ov['compute_s']:.4f} s, both at once "
            f"{ov['both_s']:.4f} s: (alone + alone - both) / min(alone), slowest rank, "
            f"{c.n} ranks, wall clock, median of 5 paired runs"))
    return out


def _gpu_table(raw: dict, c: _Context, peak: dict, model: str, hbm: float) -> dict:
    """``[gpu]``: peaks, memory, bandwidths, the measured optional rates and the two curves."""
    best_n = {d: max(rows, key=lambda r: r[2])[0] for d, rows in raw["matmul"].items()}
    gpu: dict = {"model": model}
    for d in ("bf16", "fp16", "fp32"):
        if d in peak:
            gpu[f"peak_{d}_flops_per_s"] = _figure(float(peak[d]), (
                f"{c.how}: best torch.matmul {d} square n={best_n[d]} per rank ({c.who}), mean over ranks"))
    n, cp = c.n, raw["copy"]
    gpu["hbm_bytes"] = _figure(float(hbm), c.how + ": " + (
        "torch.cuda.get_device_properties().total_memory" if c.cuda
        else f"MemTotal {raw['mem_total_bytes']} B / {n} ranks (one rank's share)"))
    gpu["hbm_bandwidth_bytes_per_s"] = _figure(float(cp["bytes_per_s"]), (
        f"{c.how}: tensor.copy_ of {cp['bytes'] >> 20} MiB fp32, 2*bytes/time {c.per_rank}"))
    gpu.update(_kernel_figures(raw, peak["bf16"], c))
    if not c.cuda and n > 1:
        gpu["fsdp_overlap"] = _figure(0.0, (
            f"{c.how}: not measured, a fact of torch {raw['torch']}: FSDP2 (ZeRO-2/3) hides its "
            "all-gathers and reduce-scatters only on separate device streams "
            "(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, get_all_gather_streams); "
            "a CPU has none, so they run in line"))
    gpu["memory_reserve_bytes"] = _figure(float(raw["footprint_bytes"]), c.how + ": " + (
        "CUDA memory in use not allocated by tensors after NCCL init (context, NCCL), max over ranks"
        if c.cuda else "VmRSS of a rank after importing torch and joining the gloo group, before "
        "any model (Python + torch + gloo), max over ranks"))
    sizes, flops, efficiency = _efficiency_curve(raw, peak)
    gpu["matmul_efficiency"] = {
        "flops": flops, "efficiency": [round(e, 4) for e in efficiency],
        "source": (f"{c.how}: torch.matmul bf16 square n=" + ",".join(str(s) for s in sizes)
                   + f" (2*n^3 FLOPs) per rank ({c.who}), achieved / peak bf16")}
    if "cross_entropy" in raw:
        ce = raw["cross_entropy"]
        gpu["cross_entropy"] = {
            "logits": [float(r[0]) for r in ce["rows"]],
            "logits_per_s": [float(r[1]) for r in ce["rows"]],
            "source": (f"{c.how}: F.cross_entropy(logits.float(), targets) forward + backward on "
                       f"bf16 logits, vocabulary {ce['vocab']}, logits per call / time, {c.per_rank}")}
    return gpu


def _link_tiers(raw: dict, c: _Context, joint: AlphaBeta | None) -> dict[str, dict]:
    """``[intra_node]`` and ``[inter_node]``: the joint fit (one host: both tiers)."""
    if joint is not None:
        sizes = sorted({r[0] for rows in raw["collectives"].values() for r in rows})
        src = (f"{c.how}: one alpha-beta least-squares fit (relative error) over the times of every "
               f"collective measured (see [collectives.*]; inside a node each uses its own fit), "
               f"{sizes[0]}..{sizes[-1]} B fp32 buffers, {c.n} ranks, {raw['backend']}; "
               f"median / max fit error {joint.median_rel_error:.0%} / {joint.max_rel_error:.0%}")
        bw, lat = joint.beta_bytes_per_s, joint.alpha_s
        sources = {"intra_node": src,
                   "inter_node": "no second host to measure: set to the intra-node fit (assumption); " + src}
    else:
        bw, lat = raw["copy"]["bytes_per_s"], 0.0
        src = (f"{c.how}: one rank, no collective to measure; bandwidth set to the copy bandwidth, "
               "latency 0 (assumption)")
        sources = {"intra_node": src, "inter_node": src}
    return {t: {"bandwidth_bytes_per_s": _figure(float(bw), s), "latency_s": _figure(float(lat), s)}
            for t, s in sources.items()}


def _collective_table(kind: str, raw: dict, c: _Context, fit: AlphaBeta, in_step: AlphaBeta | None) -> dict:
    """``[collectives.<kind>]``: the measured points, bus bandwidths and α-β fits."""
    rows = raw["collectives"][kind]
    busbw = bus_bandwidth(kind, [r[0] for r in rows], c.n, [r[1] for r in rows])
    t = {"ranks": 2 if kind == "p2p" else c.n,     # p2p: between ranks 0 and 1
         "bytes": [int(r[0]) for r in rows],
         "seconds": [_six_digits(r[1]) for r in rows],
         "bus_bandwidth_bytes_per_s": [_six_digits(x) for x in busbw],
         "alpha_s": float(fit.alpha_s), "beta_bytes_per_s": float(fit.beta_bytes_per_s),
         "fit_median_rel_error": round(fit.median_rel_error, 4),
         "fit_max_rel_error": round(fit.max_rel_error, 4),
         "source": (f"{c.how}: {kind} of fp32 buffers (nccl-tests size convention, busbw = algbw * "
                    "bus factor), slowest rank, median of 5 runs, least-squares alpha-beta in "
                    "relative error")}
    if in_step is not None:
        rows_is = raw["in_step"][kind]
        t.update({
            "in_step_bytes": [int(r[0]) for r in rows_is],
            "in_step_seconds": [_six_digits(r[1]) for r in rows_is],
            "in_step_alpha_s": float(in_step.alpha_s),
            "in_step_beta_bytes_per_s": float(in_step.beta_bytes_per_s),
            "in_step_fit_median_rel_error": round(in_step.median_rel_error, 4),
            "in_step_fit_max_rel_error": round(in_step.max_rel_error, 4),
            "in_step_source": (
                f"{c.how}: the same {kind} issued between ~5 ms (CPU) / 1 ms (GPU) of matmuls, time "
                "added per call (loop with it minus loop without, 8 calls, slowest rank, median of "
                "5 pairs, at least the back-to-back time; autopar/profile/kernels.py in_step_time), "
                "least-squares alpha-beta in relative error")})
    return t


def build_profile(raw: dict, name: str) -> tuple[str, dict]:
    """(TOML text, summary dict) of a profile from ``profile_machine``'s measurements."""
    c = _Context(raw)
    n, cuda = c.n, c.cuda
    peak = {d: max(r[2] for r in rows) for d, rows in raw["matmul"].items()}
    F, IS = fits(raw), in_step_fits(raw)
    hbm = raw["device_total_bytes"] if cuda else raw["mem_total_bytes"] / n
    model = raw.get("device_name") if cuda else f"{raw['cpu_model']}, 1 of {n} ranks, torch CPU"
    doc = {"version": 1, "name": name,
           "description": ("GPU " if cuda else "CPU host, ") + model + f", {n} ranks measured by autopar profile",
           "gpu": _gpu_table(raw, c, peak, model, hbm),
           "node": {"gpus_per_node": _figure(int(raw["gpus_per_node"]), c.how + (
               ": torch.cuda.device_count()" if cuda else f": --nproc {n} ranks on this host"))},
           **_link_tiers(raw, c, F.get("joint"))}
    comments = {}
    if raw.get("collectives"):
        doc["collectives"] = {kind: _collective_table(kind, raw, c, F[kind], IS.get(kind))
                              for kind in raw["collectives"]}
        comments = {f"collectives.{kind}": "measured; inside a node the cost model uses the " + (
            "in-step points (their alpha-beta for other group sizes)" if kind in IS else "alpha-beta")
            for kind in raw["collectives"]}
    header = (f"Measured by `autopar profile --nproc {n}{' --quick' if raw.get('quick') else ''}` "
              f"({raw['date']}, torch {raw['torch']}, {raw['backend']}).\n"
              "Every rank measured at the same time; one 'gpu' here is one rank"
              + ("." if cuda else " (one process, one thread, one core).") + "\n"
              "Format: costmodels/profiles/hardware.py. Method: autopar/profile/build.py, measure.py and kernels.py.")
    _, eff_flops, efficiency = _efficiency_curve(raw, peak)    # unrounded, for the CLI's --json
    summary = {"name": name, "peak_flops_per_s": peak, "hbm_bandwidth_bytes_per_s": raw["copy"]["bytes_per_s"],
               "hbm_bytes": hbm, "memory_reserve_bytes": raw["footprint_bytes"],
               "matmul_efficiency": {"flops": eff_flops, "efficiency": efficiency},
               "collectives": {k: _fit_summary(v) for k, v in F.items()},
               "in_step": {k: _fit_summary(v) for k, v in IS.items()}}
    return dump_profile(doc, header=header, table_comments=comments, where=name), summary


def _efficiency_curve(raw: dict, peak: dict) -> tuple[list, list[float], list[float]]:
    """(n, FLOPs, achieved / peak) of the bf16 matmuls, by size; the fraction kept in
    [1e-4, 1] (the profile format's (0, 1])."""
    bf = sorted(raw["matmul"]["bf16"], key=lambda r: r[1])
    return ([r[0] for r in bf], [float(r[1]) for r in bf],
            [min(1.0, max(1e-4, r[2] / peak["bf16"])) for r in bf])


def _fit_summary(fit) -> dict:
    return {"alpha_s": fit.alpha_s, "beta_bytes_per_s": fit.beta_bytes_per_s,
            "median_rel_error": fit.median_rel_error, "max_rel_error": fit.max_rel_error}
