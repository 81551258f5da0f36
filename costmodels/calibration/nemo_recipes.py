"""What a published NeMo (Megatron-core + Transformer Engine) run switched on, as autopar's
``megatron`` runtime options: one rule for every harness that turns NeMo rows into plans
(``fp8_runs``, ``cp_runs``, ``dgxc_runs``), so an FP8 row, its BF16 pair and a cp row of the
same recipe are priced with the same overlaps.

The switches (runtime-profiles/megatron.toml says what each prices):

* ``overlap_grad_reduce,overlap_param_gather`` always: NeMo's distributed optimizer runs with
  ``overlap_grad_sync`` / ``overlap_param_sync`` on in every recipe these rows come from (NeMo 1
  launcher yamls of dgxc-benchmarking v24.11.1; NeMo 2 ``MegatronMixedPrecision`` /
  ``DistributedDataParallelConfig(overlap_grad_reduce=True, overlap_param_gather=True)`` of the
  llm recipes behind v25.x and the performance summaries).
* ``tp_comm_overlap`` (Transformer Engine userbuffers) where the row's yaml says
  ``ub_tp_comm_overlap true``, never where it says ``false`` (the v24.11.1 Llama 3.1 8B and
  Nemotron-4 340B yamls); where the row does not say and tp > 1, ON — INFERRED: NeMo's
  performance recipes attach ``MegatronCommOverlapCallback(tp_comm_overlap=True)`` with a
  userbuffers configuration per layout, and ``nemo/collections/llm/recipes/tp_overlap_configs/
  userbuffers.py`` ships one for each H100 / B200 layout of these tables (e.g.
  ``userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192`` for the Llama 3.1 405B rows,
  ``userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192`` for 70B). The rule is on what the
  recipe states, never on a row's error; ``inferred`` says when it was used.
* ``distributed_fused_adam`` and ``bf16_grad_reduce`` only where the row's notes say so
  (``distributed_fused_adam``, ``grad_sync_dtype bf16``).

One run appears in several open CSVs (a dgxc-benchmarking README table row is in
``dgxc_nemo_h100.csv``, ``cp_runs.csv`` and ``fp8_runs.csv``, BF16 and FP8 runs of one yaml side
by side) and only some copies carry the yaml's switches. ``recipe_notes`` indexes the notes of
every copy by (release, README file, GPUs) — ``readme_key`` — so each copy is priced with what
its yaml set (e.g. the v24.11.1 Nemotron-4 340B yaml's ``ub_tp_comm_overlap false``, stated in
``dgxc_nemo_h100.csv`` only, holds for its FP8 rows in ``fp8_runs.csv`` too).
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

NEMO_BASE = ("overlap_grad_reduce", "overlap_param_gather")
_NEMO2 = re.compile(r"NeMo 2(?!\d)")   # "NeMo 2 (...)", "NeMo 2.0"; not the container "NeMo 24.09"
_UB = re.compile(r"ub_tp_comm_overlap\s*[:=]?\s*(true|false)", re.IGNORECASE)


def tp_overlap_stated(notes: str) -> bool | None:
    """True / False where the notes state ``ub_tp_comm_overlap``; None where they do not."""
    m = _UB.search(notes or "")
    return None if m is None else m.group(1).lower() == "true"


def nemo_runtime(notes: str, tp: int, base: tuple[str, ...] = NEMO_BASE) -> tuple[str, bool]:
    """(the ``megatron`` runtime spec with the switches the row's recipe sets, whether the TP
    overlap was inferred rather than read) — module docstring."""
    opts = list(base)
    stated = tp_overlap_stated(notes)
    inferred = stated is None and tp > 1
    if stated or inferred:
        opts.append("tp_comm_overlap")
    if "distributed_fused_adam" in (notes or ""):
        opts.append("distributed_fused_adam")
    if "grad_sync_dtype bf16" in (notes or ""):
        opts.append("bf16_grad_reduce")
    return "megatron" + (":" + ",".join(opts) if opts else ""), inferred


def with_p2p_overlap(runtime: str, notes: str, framework: str, pp: int, vpp: int) -> str:
    """``runtime`` with ``overlap_p2p_comm`` where the run interleaved (pp > 1, vpp > 1) and its
    recipe overlapped the pipeline sends: every NeMo 2 run (``MegatronCommOverlapCallback`` sets
    ``overlap_p2p_comm = True`` for vp > 1, nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py),
    a NeMo 1 run only where its yaml says ``overlap_p2p_comm true`` (NeMo 1's default is false);
    costmodels/model/interleaved_p2p_overlap.py prices it."""
    if pp <= 1 or vpp <= 1 or "overlap_p2p_comm" in runtime:
        return runtime
    if not (_NEMO2.search(framework or "") or "overlap_p2p_comm true" in (notes or "")):
        return runtime
    return runtime + (",overlap_p2p_comm" if ":" in runtime else ":overlap_p2p_comm")


_README = re.compile(r"(v\d+\.\d+\.\d+).*?(\w+/README\w*\.md)")


def readme_key(source_ref: str, gpus) -> tuple[str, str, int] | None:
    """(release, README file, GPUs) of a dgxc-benchmarking row, or None for other sources."""
    m = _README.search(source_ref or "")
    return (m.group(1), m.group(2), int(gpus)) if m else None


def recipe_notes(*paths: Path) -> dict[tuple[str, str, int], str]:
    """``readme_key`` → the notes of every copy of that run in the CSVs ``paths`` (those that
    exist), joined: what any copy says of the yaml (module docstring)."""
    out: dict[tuple[str, str, int], str] = {}
    for path in paths:
        if not Path(path).is_file():
            continue
        with open(path) as f:
            for r in csv.DictReader(f):
                key = readme_key(r.get("source_ref", ""), r.get("gpus") or 0)
                text = _said(r)
                if key and text and text not in out.get(key, ""):
                    out[key] = (out.get(key, "") + " " + text).strip()
    return out


def row_notes(row: dict, index: dict) -> str:
    """The row's own notes and those of its other copies (``recipe_notes``)."""
    key = readme_key(row.get("source_ref", ""), row.get("gpus") or 0)
    return (_said(row) + " " + index.get(key, "")).strip()


def _said(row: dict) -> str:
    """What a row says of its recipe: its notes and its ``zero`` column (the open CSVs write
    e.g. ``1 (distributed_fused_adam)`` there)."""
    return " ".join(x for x in (row.get("notes") or "", row.get("zero") or "") if x)
