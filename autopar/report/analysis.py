"""What the report says in words and numbers: ranking, bottlenecks, diffs and scaling.

Plans are compared within their *search* (same model, hardware, GPU count, global batch and
sequence length): the best there is the fitting plan with the least step time. Across searches
the report draws the scaling curve: for each GPU count N the best plan's throughput, and its
speed-up and efficiency against the smallest GPU count searched, N₀ (a real plan that fits):
speed-up ``N₀·T(N₀) / T(N)``, efficiency ``speed-up / N`` (100 % at N₀). A one-GPU step time is
used only when the inputs hold a one-GPU plan, or a caller passes ``one_gpu_time`` (the cost
model's ``one_gpu_time_from_cost_model``: a run that could not fit, memory ignored, which made
every real count look inefficient).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autopar.report.load import COMM_KINDS, MEMORY_KEYS, PlanRecord
from costmodels.contracts.breakdown import BREAKDOWN_KEYS, COMM_KIND_LABELS, TERM_LABELS
from costmodels.contracts.breakdown import bottleneck as find_bottleneck
from costmodels.contracts.plan import PLAN_FIELDS


# ---- small helpers ------------------------------------------------------------------------
def gib(n: float) -> str:
    """Bytes in GiB (2³⁰), the unit every command prints."""
    return f"{n / 2 ** 30:.1f} GiB"


def seconds(t: float) -> str:
    if t >= 1000:
        return f"{t:,.0f} s"
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def breakdown(r: PlanRecord) -> dict[str, float]:
    b = r.get("breakdown_s") or {}
    out = {k: float(b.get(k, 0.0) or 0.0) for k in BREAKDOWN_KEYS}
    rest = float(r["step_time_s"]) - sum(out.values())
    if abs(rest) > 1e-6 * max(float(r["step_time_s"]), 1e-12) and not b:
        out["compute"] += rest   # no breakdown given: call it all compute
    return out


def memory_parts(m: dict) -> dict[str, float]:
    return {k: float(m.get(k, 0.0) or 0.0) for k in MEMORY_KEYS}


def hbm(r: PlanRecord) -> float | None:
    v = r.get("hbm_bytes")
    return float(v) if isinstance(v, (int, float)) else None


def groups(records: list[PlanRecord]) -> list[list[PlanRecord]]:
    """Records per search, each group ordered best first (fitting, then step time)."""
    out: dict[tuple, list[PlanRecord]] = {}
    for r in records:
        out.setdefault(r.group, []).append(r)
    ordered = sorted(out.values(), key=lambda g: (str(g[0].get("model")), g[0].gpus, str(g[0].get("hardware")),
                                                  int(g[0].get("global_batch") or 0), int(g[0].get("seq") or 0)))
    return [sorted(g, key=rank_key) for g in ordered]


def rank_key(r: PlanRecord):
    return (not bool(r["fits"]), float(r["step_time_s"]), r.file_rank)


def trusted_rank_key(r: PlanRecord, check=None):
    """``rank_key`` with the simulated step time for a plan the schedule check flags."""
    t = check.simulated_step_s if check is not None and check.flagged else float(r["step_time_s"])
    return (not bool(r["fits"]), t, r.file_rank)


def stage_memories(r: PlanRecord) -> list[tuple[int, dict[str, float], float]]:
    """(stage, parts, total) per pipeline rank; the whole-plan figure when no stages_detail."""
    detail = r.get("stages_detail") or []
    out = []
    for s in detail:
        m = s.get("memory_bytes") or {}
        parts = memory_parts(m)
        out.append((int(s.get("stage", len(out))), parts, float(m.get("total", sum(parts.values())))))
    if not out:
        parts = memory_parts(r["memory_bytes"])
        out.append((0, parts, float(r["memory_bytes"].get("total", sum(parts.values())))))
    return sorted(out, key=lambda x: x[0])


def most_loaded_stage(r: PlanRecord) -> int:
    """The pipeline stage whose GPU holds the most memory (the one the plan's memory figure is)."""
    mems = stage_memories(r)
    return max(mems, key=lambda x: x[2])[0]


def comm_rows(r: PlanRecord) -> list[dict[str, Any]]:
    """Communication per collective: kind, collective, group size, tier, bytes, time, exposed."""
    rows = r.get("comm")
    if rows:
        return [dict(c) for c in rows if isinstance(c, dict)]
    cb = r.get("comm_bytes") or {}
    return [{"kind": k, "collective": "", "group_size": None, "tier": "unknown",
             "bytes_per_gpu": float(cb[k]), "time_s": None, "exposed_s": None}
            for k in COMM_KINDS if cb.get(k)]


# ---- why this plan ------------------------------------------------------------------------
def bottleneck(r: PlanRecord) -> tuple[str | None, str]:
    """(term key, sentence) naming what limits this plan's step time: the bottleneck as
    ``costmodels.contracts.breakdown.bottleneck`` defines it (``autopar explain`` names the same one);
    (None, why not) when the input has no step-time breakdown."""
    bn = find_bottleneck(r.data)
    if bn is None:
        return None, "the input has no step-time breakdown, so no bottleneck to name"
    b = breakdown(r)
    step = float(r["step_time_s"]) or 1e-30
    share_c = b["compute"] / step
    if bn.term == "compute":
        overheads = {k: v for k, v in b.items() if k != "compute"}
        worst = max(overheads, key=overheads.get)
        rest = (f"the largest overhead is {TERM_LABELS[worst]} ({pct(overheads[worst] / step)})"
                if overheads[worst] > 0 else "there is no overhead")
        text = f"compute-bound: compute{bn.where()} is the largest term, {pct(share_c)} of the step; {rest}"
    else:
        text = (f"{bn.label}{bn.where()} is the largest term, {pct(bn.seconds / step)} of the step "
                f"({seconds(bn.seconds)}); compute is {pct(share_c)}")
    return bn.term, text


def memory_sentence(r: PlanRecord) -> str:
    total = float(r["memory_bytes"].get("total", 0.0))
    h = hbm(r)
    stage = most_loaded_stage(r)
    where = f" on pipeline stage {stage}" if r.plan.pp > 1 else ""
    if h:
        state = "fits" if r["fits"] else "does NOT fit"
        return f"{gib(total)} of {gib(h)} HBM per GPU{where} ({pct(total / h)}; {state})"
    return f"{gib(total)} per GPU{where}"


def field_diff(a: PlanRecord, b: PlanRecord) -> list[tuple[str, Any, Any]]:
    da, db = a.plan.to_dict(), b.plan.to_dict()
    return [(k, da[k], db[k]) for k in PLAN_FIELDS if da.get(k) != db.get(k)]


def loses_on(best: PlanRecord, other: PlanRecord) -> str:
    """One sentence: why ``other`` ranks below ``best``."""
    changes = ", ".join(f"{k} {_fmt(vb)} vs {_fmt(va)}" for k, va, vb in field_diff(best, other)
                        if k != "stages") or "same plan fields"
    if not other["fits"] and best["fits"]:
        return (f"does not fit: {gib(float(other['memory_bytes'].get('total', 0)))} > "
                f"{gib(hbm(other) or 0)} HBM ({changes})")
    dt = float(other["step_time_s"]) - float(best["step_time_s"])
    ba, bo = breakdown(best), breakdown(other)
    deltas = {k: bo[k] - ba[k] for k in BREAKDOWN_KEYS}
    worst = max(deltas, key=deltas.get)
    rel = dt / float(best["step_time_s"]) if best["step_time_s"] else 0.0
    if dt <= 0:
        return f"ties the best ({seconds(float(other['step_time_s']))}; {changes})"
    gains = [k for k, v in deltas.items() if v < -1e-12]
    gain = min(gains, key=deltas.get) if gains else None
    s = (f"{seconds(dt)} (+{pct(rel)}) slower, mostly {TERM_LABELS[worst]} "
         f"+{seconds(deltas[worst])}")
    if gain:
        s += f" (while saving {seconds(-deltas[gain])} of {TERM_LABELS[gain]})"
    return s + f"; {changes}"


def why(group: list[PlanRecord]) -> dict[str, Any]:
    best = group[0]
    key, text = bottleneck(best)
    return {"best": best, "bottleneck": key, "bottleneck_text": text,
            "memory_text": memory_sentence(best),
            "runners_up": [(r, loses_on(best, r)) for r in group[1:]]}


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def stage_ranges_text(stages) -> str:
    """A stage split as readable row ranges: [[0, 5], [5, 9]] -> "rows 0–4 | 5–8" (each stage's
    first and last layer-table row, 0 the embedding), "balanced" when the plan pins none."""
    if not stages:
        return "balanced"
    try:
        ranges = " | ".join(f"{a}–{b - 1}" if b - a > 1 else f"{a}" for a, b in stages)
        if len(stages) <= 4:
            return "rows " + ranges
        # many stages (a deep or interleaved pipeline): their count and sizes first, then the ranges
        sizes = [b - a for a, b in stages]
        each = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}–{max(sizes)}"
        return f"{len(stages)} stages of {each} rows: {ranges}"
    except (TypeError, ValueError):
        return _fmt(stages)


# ---- diff of two plans ----------------------------------------------------------------------
def diff(a: PlanRecord, b: PlanRecord) -> list[tuple[str, str, str, str]]:
    """Rows (what, plan a, plan b, b − a) for differing plan fields and every prediction."""
    rows = []
    for k, va, vb in field_diff(a, b):
        rows.append((k, *((stage_ranges_text(va), stage_ranges_text(vb)) if k == "stages"
                          else (_fmt(va), _fmt(vb))), ""))
    for k in ("model", "hardware", "gpus", "global_batch", "seq"):
        if a.get(k) != b.get(k):
            rows.append((k, _fmt(a.get(k)), _fmt(b.get(k)), ""))

    def num(name, va, vb, fmt, rel=True, dfmt=None):
        d = vb - va
        if abs(d) <= 1e-9 * max(abs(va), abs(vb), 1e-30):
            rows.append((name, fmt(va), fmt(vb), "same"))
            return
        ds = ("+" if d >= 0 else "−") + (dfmt or fmt)(abs(d))
        if rel and va:
            ds += f" ({'+' if d >= 0 else '−'}{pct(abs(d) / va)})"
        rows.append((name, fmt(va), fmt(vb), ds))

    num("step time", float(a["step_time_s"]), float(b["step_time_s"]), seconds)
    num("tokens/s", float(a["tokens_per_s"]), float(b["tokens_per_s"]), lambda x: f"{x:,.0f}")
    if "tflops_per_gpu" in a.data and "tflops_per_gpu" in b.data:
        num("TFLOP/s per GPU", float(a["tflops_per_gpu"]), float(b["tflops_per_gpu"]), lambda x: f"{x:.1f}")
    if "mfu" in a.data and "mfu" in b.data:
        num("MFU", float(a["mfu"]), float(b["mfu"]), pct, rel=False, dfmt=lambda x: f"{100 * x:.1f} points")
    num("memory per GPU", float(a["memory_bytes"].get("total", 0)), float(b["memory_bytes"].get("total", 0)), gib)
    rows.append(("fits", "yes" if a["fits"] else "no", "yes" if b["fits"] else "no", ""))
    ba, bb = breakdown(a), breakdown(b)
    for k in BREAKDOWN_KEYS:
        if ba[k] or bb[k]:
            num(f"  {TERM_LABELS[k]}", ba[k], bb[k], seconds, rel=False)
    ca, cbb = a.get("comm_bytes") or {}, b.get("comm_bytes") or {}
    for k in COMM_KINDS:
        if ca.get(k) or cbb.get(k):
            num(f"  {COMM_KIND_LABELS[k]} bytes/GPU", float(ca.get(k, 0) or 0), float(cbb.get(k, 0) or 0),
                gib, rel=False)
    return rows


# ---- scaling ------------------------------------------------------------------------------
@dataclass
class ScalingPoint:
    gpus: int
    record: PlanRecord
    step_time_s: float
    tokens_per_s: float
    speedup: float | None = None
    efficiency: float | None = None


@dataclass
class ScalingSeries:
    key: tuple                     # (model, hardware, global_batch, seq)
    points: list[ScalingPoint]
    one_gpu_time_s: float | None = None
    one_gpu_note: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        model, hw, batch, seq = self.key
        return f"{model} · {hw} · batch {batch}" + (f" · seq {seq}" if seq else "")


def scaling(records: list[PlanRecord], one_gpu_time=None) -> list[ScalingSeries]:
    """One series per (model, hardware, global batch, seq), best plan at each GPU count.

    ``one_gpu_time(model, hardware, global_batch, seq) -> (seconds | None, note)`` gives T(1);
    without one (or when it returns None) T(1) is extrapolated as N₀·T(N₀) from the smallest
    count N₀, i.e. speed-up and efficiency are relative to perfect scaling up to N₀, and the
    series' note says so."""
    series: dict[tuple, dict[int, PlanRecord]] = {}
    for g in groups(records):
        best = g[0]
        key = (best.get("model"), best.get("hardware"), best.get("global_batch"), best.get("seq"))
        series.setdefault(key, {})[best.gpus] = best
    out = []
    for key, by_n in series.items():
        pts = [ScalingPoint(n, r, float(r["step_time_s"]), float(r["tokens_per_s"]))
               for n, r in sorted(by_n.items())]
        s = ScalingSeries(key, pts)
        t1, note = (one_gpu_time(*key) if one_gpu_time else (None, ""))
        if 1 in by_n and (not t1 or float(by_n[1]["step_time_s"]) < t1):
            t1 = float(by_n[1]["step_time_s"])
            note = f"T(1) = {seconds(t1)}: the best one-GPU plan in the inputs (#{by_n[1].id})"
        if t1:
            s.one_gpu_time_s, s.one_gpu_note = t1, note
        else:
            n0 = pts[0]
            s.one_gpu_time_s = n0.gpus * n0.step_time_s
            s.one_gpu_note = (f"against the smallest GPU count searched, {n0.gpus} (plan #{n0.record.id}): "
                              f"speed-up = {n0.gpus} × T({n0.gpus}) / T(N), efficiency = speed-up / N, "
                              f"100 % at {n0.gpus} (one-GPU time not available"
                              f"{': ' + note if note else ''})")
        for p in pts:
            if p.step_time_s > 0:
                p.speedup = s.one_gpu_time_s / p.step_time_s
                p.efficiency = p.speedup / p.gpus
            if not p.record["fits"]:
                s.notes.append(f"the best plan at {p.gpus} GPUs does not fit in HBM")
        out.append(s)
    return out


def one_gpu_time_from_cost_model(model, hardware, global_batch, seq, table=None):
    """T(1): the cost model's step time for dp = tp = pp = 1 on the whole global batch (memory
    ignored), the best over power-of-two micro-batch sizes that divide the batch and over
    recompute none / selective. ``table``: the model's LayerTable (traced with
    ``autopar.trace.table_for`` when not given)."""
    try:
        from costmodels.contracts.plan import Plan
        from costmodels.model.estimate import estimate
        from costmodels.profiles.hardware_files import load_profile
        if table is None:
            from autopar.trace import table_for
            table = table_for(model, micro_batch=1, seq=seq)
        profile = load_profile(hardware)
        sizes = [2 ** i for i in range(int(global_batch).bit_length()) if int(global_batch) % 2 ** i == 0]
        best = min((estimate(table, profile, Plan(micro_batch_size=b, recompute=rc), 1, int(global_batch))
                    for b in sizes for rc in ("none", "selective")),
                   key=lambda e: float(e.step_time_s))
        t = float(best.step_time_s)
        return t, (f"T(1) = {seconds(t)}: the cost model's step time on one GPU (dp = tp = pp = 1, "
                   f"micro-batch {best.to_dict().get('micro_batch_size')}, memory ignored)")
    except Exception as e:  # no cost model / trace for this model: fall back, and say why
        return None, f"{type(e).__name__}: {e}"
