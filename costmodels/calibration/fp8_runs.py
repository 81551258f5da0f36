"""Published FP8 / MXFP8 training runs (``fp8_runs.csv``) as plans the cost model scores, and the
fit of each (GPU, stack)'s one FP8 constant, ``fp8_matmul_scale``.

Each row becomes an ``Fp8Run`` (the FP8 run, and where the source gives it the BF16 run of the
same layout and release beside it, ``pair_row_id``). Rows autopar cannot express are left out
with their reason (``skipped``): JAX stacks (MaxText, Paxml: no runtime profile), NVFP4. Rows with
context parallelism (``cp > 1``) are scored with their cp (``costmodels.model.context_parallel``).

How rows become plans (a rule of this harness, stated, not fitted):

* stack: NeMo / Megatron-core → runtime ``megatron`` (Transformer Engine) with the switches the
  row's recipe sets (``nemo_recipes.nemo_runtime``: distributed-optimizer overlaps, TP-comm
  overlap as the yaml says — in this row or in another copy of the same run in
  ``dgxc_nemo_h100.csv`` / ``cp_runs.csv`` beside it, ``nemo_recipes.recipe_notes`` — or,
  unstated at tp > 1, inferred on; NeMo 2 FP8 rows reduce gradients in bf16, as NeMo's
  performance scripts set for FP8 only, ``fp8_run_runtimes.nemo_fp8_runtime``; interleaved NeMo 2 runs, and
  NeMo 1 runs whose yaml says so, overlap their pipeline sends, ``nemo_recipes.with_p2p_overlap``);
  torchtitan and the
  torchao README → ``fsdp`` (torchao float8), ``fsdp:async_tp`` where the row (or its BF16
  pair, for the pair's plan) states async TP; Composer (llm-foundry) → ``fsdp:fsdp1,bf16_reduce,
  fused_cross_entropy,torch113_checkpoint`` (TE under FSDP1, ``precision.stack_key`` = ``composer``);
* GPU: H100 → h100-80g-sxm (a 95/96 GB part gets its HBM), H200 → h200-141g-sxm, B200 →
  b200-180g-sxm, GB200 → gb200-nvl72;
* model: Llama as the ``llama`` family; Nemotron-4 as the traced squared-ReLU transformers
  config of its shape beside the CSV (``models/nemotron4-*.json``, traced at the row's seq), the
  model ``dgxc_runs`` prices the same runs with (``costmodels.calibration.traced_configs``); a
  Nemotron row with no such config (Nemotron-3) as ``llama`` with ``ffn ≈ 2f/3`` (a SwiGLU of
  three matmuls: the same weights and FLOPs, but three f-wide activations kept, not two);
  GPT-3 and MPT as ``gpt`` (tied; dropout 0 unless the row's notes state the yaml's, as
  the v24.11.1 GPT-3 175B rows do: ``dropout 0.1``, the figure ``dgxc_nemo_h100.csv`` prices the
  same runs' BF16 copies with);
* plan: dp = gpus / (tp·pp·cp), ZeRO-1 (distributed optimizer) or ZeRO-3 (FSDP), sequence
  parallel where stated or where the stack always runs it (``stated_sequence_parallel``),
  interleaved 1F1B where vpp > 1; recompute "none" where a
  NeMo recipe was not read (inferred, flagged), torchtitan's selective / per-op policies as the
  mean of the none and full estimates (as ``open_runs`` does);
* torchtitan with pp > 1: the published batch is the local batch; micro-batches of 1 (its
  ``pipeline_parallel_microbatch_size`` default), vpp 2 for its Interleaved1F1B rows;
* published step: ``step_time_s``, else ``global_batch · seq / (tokens_per_s_per_gpu · gpus)``;
* ``CORRECTIONS``: a field the CSV transcribed differently from the source it cites, taken from
  the source (the v25.04.02 Nemotron-4 340B rows: VP 12 in the release's config table).

**Calibration split** (a rule on what a row is, never on its error): per (GPU, stack), the
paired rows of ONE model fit that pair's scale on the FP8 ÷ BF16 speed-up (``CALIBRATION``;
of a model with weak- and strong-scaling sweeps, the weak one); every other row is a check row.
A (GPU, stack) without a calibration model borrows the scale of ``BORROW`` and says so. torchao's
rowwise recipe is its own key (``fsdp-rowwise``: another GEMM kernel, ``precision.stack_scale``),
fitted on its one paired row; elsewhere rowwise plans fall back to the stack's scale.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

from costmodels.calibration.fp8_run_runtimes import nemo_fp8_runtime, titan_runtime
from costmodels.calibration.nemo_recipes import nemo_runtime, recipe_notes, row_notes, with_p2p_overlap
from costmodels.calibration.traced_configs import traced_nemotron_config
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

_DROPOUT = re.compile(r"dropout ([0-9.]+)")
# llm-foundry PR #543 tables: torch before 2.1, no checkpoint early stop (open_runs.mpt_runtime)
COMPOSER_RUNTIME = "fsdp:fsdp1,bf16_reduce,fused_cross_entropy,torch113_checkpoint"
# (profile, stack) -> the model whose paired rows fit the scale
CALIBRATION = {("h100-80g-sxm", "megatron"): "nemotron4-15b", ("gb200-nvl72", "megatron"): "nemotron4-340b",
               ("h100-80g-sxm", "fsdp"): "llama3-8b", ("h100-80g-sxm", "composer"): "mpt-1b",
               ("b200-180g-sxm", "fsdp"): "llama3-8b", ("h100-80g-sxm", "fsdp-rowwise"): "llama3-8b"}
BORROW = {("b200-180g-sxm", "megatron"): ("gb200-nvl72", "megatron"),
          ("h200-141g-sxm", "fsdp"): ("h100-80g-sxm", "fsdp")}
HALF = ("selective", "per-op")
# fields the CSV transcribed wrongly, corrected from the source it cites (a rule on what the source
# says, never on a row's error): row-id prefix -> {field: value}
CORRECTIONS = {
    "dgxc-v25.04.02-nemotron4-340b-": {
        "vpp": 12,   # nemotron/README.md of that release, config table: 340b BF16/FP8, 256-2048 GPUs,
                     # TP 8, PP 8, CP 1, VP 12, MBS 1, GBS 64-512 (the CSV has vpp 1)
    },
}


@dataclass(frozen=True)
class Fp8Run:
    row_id: str
    hardware: str
    stack: str                 # the fp8_matmul_scale key: precision.STACKS key (+ "-rowwise", stack_scale)
    model: str
    spec: str
    plans: tuple[Plan, ...]    # one, or (none, full) for a partial recompute policy (averaged)
    bf16_plans: tuple[Plan, ...]
    gpus: int
    global_batch: int
    published_step_s: float | None
    published_speedup: float | None
    role: str                  # calibration | check
    hbm_bytes: float | None
    label: str
    seq: int | None = None     # the row's sequence: an ``hf:`` config is traced at it (run_table)
    published_memory_gib: float | None = None   # the source's peak memory (torchtitan: max reserved over ranks)


def _f(x: str) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _hardware(gpu: str) -> tuple[str | None, float | None]:
    if "GB200" in gpu:
        return "gb200-nvl72", None
    if "B200" in gpu:
        return "b200-180g-sxm", None
    if "H200" in gpu:
        return "h200-141g-sxm", None
    if "H100" in gpu:
        for gb in ("95GB", "96GB"):
            if gb in gpu:
                return "h100-80g-sxm", float(gb[:2]) * 2 ** 30
        return "h100-80g-sxm", None
    return None, None


def _spec(r, models: Path | None = None) -> str | None:
    m, fam = r["model"], r["family"] or ""
    g = {k: int(float(r[k])) for k in ("layers", "hidden", "heads", "vocab", "seq") if _f(r[k])}
    if len(g) < 5:
        return None
    traced = traced_nemotron_config(r, models) if models is not None else None
    if traced is not None:   # the squared-ReLU model dgxc_runs prices the same runs with
        return "hf:" + str(traced)
    if m.startswith("mpt") or m.startswith("gpt3"):
        drop = _DROPOUT.search(r.get("notes") or "")   # the yaml's dropout where the row states it
        return (f"gpt:layers={g['layers']},hidden={g['hidden']},heads={g['heads']},vocab={g['vocab']},"
                f"seq={g['seq']},dropout={drop.group(1) if drop else 0},tied=true")
    ffn, kv = int(float(r["ffn"])), int(float(r["kv_heads"] or g["heads"]))
    if "nemotron" in fam or m.startswith("nemotron"):
        # 2f/3 to the nearest multiple of 128: a width whose tp ≤ 8 shards stay multiples of 16,
        # as the model's own f (16384) does, so the proxy runs where Transformer Engine's FP8 ran it
        # (costmodels/profiles/fp8_shapes.py; 2·16384/3 = 10922.7 -> 10880, 0.4 % fewer MLP FLOPs)
        ffn = 128 * round(2 * ffn / 3 / 128)
    elif not m.startswith("llama"):
        return None
    return (f"llama:layers={g['layers']},hidden={g['hidden']},heads={g['heads']},kv_heads={kv},"
            f"ffn={ffn},vocab={g['vocab']},seq={g['seq']}")


def _precision(r) -> str:
    if r["precision"] == "mxfp8":
        return "mxfp8"
    return "fp8-rowwise" if "rowwise" in (r["precision_detail"] + r["row_id"]) else "fp8"


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: fp8_runs.csv missing; pass --csv")
    with open(path) as f:
        return list(csv.DictReader(f))


def fp8_runs(path: Path) -> tuple[list[Fp8Run], list[tuple[str, str]]]:
    """(the scorable FP8 runs, [(row_id, why not scorable)])."""
    rows = read_rows(path)
    by_id = {r["row_id"]: r for r in rows}
    notes = recipe_notes(path, path.parent / "dgxc_nemo_h100.csv", path.parent / "cp_runs.csv")
    runs, skipped = [], []
    for r in rows:
        if r["precision"] == "bf16":
            continue
        why = _why_not(r)
        if why:
            skipped.append((r["row_id"], why))
            continue
        hw, hbm = _hardware(r["gpu"])
        fw = r["framework"]
        stack = "megatron" if ("NeMo" in fw or "Megatron" in fw) else "composer" if "Composer" in fw else "fsdp"
        scale_key = stack + "-rowwise" if stack == "fsdp" and _precision(r) == "fp8-rowwise" else stack
        gpus, tp, pp, cp = int(r["gpus"]), int(r["tp"]), int(r["pp"]), int(r["cp"] or 1)
        runtime = (COMPOSER_RUNTIME if stack == "composer"
                   else nemo_fp8_runtime(r, nemo_runtime(row_notes(r, notes), tp)[0]) if stack == "megatron"
                   else titan_runtime(r, tp))
        vpp = int(_f(r["vpp"]) or (2 if "interleaved" in r["row_id"] else 1))
        vpp = next((c["vpp"] for k, c in CORRECTIONS.items() if r["row_id"].startswith(k) and "vpp" in c), vpp)
        if stack == "megatron":   # the interleaved sends NeMo overlapped (nemo_recipes.with_p2p_overlap)
            runtime = with_p2p_overlap(runtime, row_notes(r, notes), fw, pp, vpp)
        dp = gpus // (tp * pp * cp)
        mb = int(r["micro_batch"])
        gb = int(_f(r["global_batch"]) or dp * mb)
        if stack == "fsdp" and pp > 1:   # torchtitan's column is the local batch, cut into
            mb = titan_pipeline_micro_batch(r, mb, pp)   # micro-batches as its release did
        zero = titan_pipeline_zero(r, stack, pp, 3 if r["zero"].startswith("3") else 1)
        sp = stated_sequence_parallel(r, stack, tp, runtime)
        rc = r["recompute"]
        base = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, micro_batch_size=mb, zero=zero, sequence_parallel=sp,
                    schedule="interleaved-1f1b" if vpp > 1 else "1f1b", runtime=runtime)
        if rc.startswith("full"):
            bplans = (base.with_(recompute="full"),)
        elif any(rc.startswith(h) for h in HALF) and stack != "megatron":
            bplans = (base, base.with_(recompute="full"))
        elif rc.startswith("selective"):
            bplans = (base.with_(recompute="selective"),)
        else:
            bplans = (base,)
        plans = tuple(p.with_(precision=_precision(r)) for p in bplans)
        pair = by_id.get(r["pair_row_id"])
        if stack in ("fsdp", "megatron") and pair is not None:   # the BF16 run with its own switches
            brt = titan_runtime(pair, tp) if stack == "fsdp" else with_p2p_overlap(
                nemo_runtime(row_notes(pair, notes), tp)[0], row_notes(pair, notes), pair["framework"], pp, vpp)
            bplans = tuple(p.with_(runtime=brt) for p in bplans)
        step = _f(r["step_time_s"])
        tok = _f(r["tokens_per_s_per_gpu"])
        seq = int(float(r["seq"]))
        if step is None and tok:
            step = gb * seq / (tok * gpus)
        speed = _f(r["speedup_vs_pair"]) if r["pair_row_id"] in by_id else None
        calib = CALIBRATION.get((hw, scale_key)) == r["model"] and speed is not None and "strong" not in r["row_id"]
        spec = _spec(r, path.parent / "models")   # Nemotron-4: the traced config beside the CSV
        runs.append(Fp8Run(r["row_id"], hw, scale_key, r["model"], spec, plans, bplans, gpus, gb, step, speed,
                           "calibration" if calib else "check", hbm,
                           f"{r['model']} {gpus} GPUs tp{tp} pp{pp} vpp{vpp} mb{mb} seq {seq} {r['precision']}", seq,
                           _f(r.get("memory_gib"))))
    return runs, skipped


def titan_pipeline_micro_batch(r, local_batch: int, pp: int) -> int:
    """The micro-batch of a torchtitan pipeline row whose ``micro_batch`` column is the local batch.
    Before pytorch/torchtitan 5e2033c (2025-04-07, "[PP] Add microbatch_size and remove
    num_microbatches config") ``experimental.pipeline_parallel_microbatches`` defaulted to the
    pipeline degree (9dec370, the Dec 2024 benchmark rows' release: torchtitan/parallelisms/
    pipelining_utils.py build_pipeline_schedule, ``n_microbatches = pipeline_parallel_degree``),
    so the local batch is cut into pp micro-batches; from 5e2033c on into micro-batches of
    ``pipeline_parallel_microbatch_size`` = 1. The row's release is its ``container`` column."""
    if "torchtitan 9dec370" in (r.get("container") or "") and local_batch % pp == 0:
        return local_batch // pp
    return 1


def titan_pipeline_zero(r, stack: str, pp: int, zero: int) -> int:
    """ZeRO-2 for a torchtitan FSDP2 run with pp > 1 whose row states no reshard policy: its
    ``parallelism.fsdp_reshard_after_forward`` default ("default") is ``reshard_after_forward =
    not pp_enabled`` for every block and the root model (pytorch/torchtitan 81c1243 and 0.2.2,
    torchtitan/models/llama3/infra/parallelize.py ``apply_fsdp``: "For PP, do not reshard after
    forward to avoid per-microbatch all-gathers"), so each stage's weights stay gathered from a
    micro-batch's forward to its backward: FSDP SHARD_GRAD_OP, which the fsdp runtime prices as
    ZeRO-2 (gathers every forward, none in the backward, weights whole). autopar's torchtitan
    importer reads the policy the same way (``autopar.export.torchtitan``: "default" under pp is
    ZeRO-2) and its exporter writes ZeRO-3 as "always", so the fsdp runtime's ZeRO-3 stays the
    per-layer reshard it runs."""
    if stack == "fsdp" and pp > 1 and zero == 3 and "reshard" not in (r.get("notes") or ""):
        return 2
    return zero


def stated_sequence_parallel(r, stack: str, tp: int, runtime: str) -> bool:
    """Whether the run sharded its norm / dropout activations over the tp ranks (sequence
    parallelism), from what its stack does, never from its error:

    * the row's ``sequence_parallel`` column where it says ``true``;
    * torchtitan / torchao (``fsdp``) at tp > 1: always — its ``apply_tp`` has no switch for it
      ("Apply tensor + sequence parallelism to every transformer block": ``attention_norm`` and
      ``ffn_norm`` are ``SequenceParallel()``, ``wo`` / ``w2`` reduce-scatter to ``Shard(1)``;
      pytorch/torchtitan 004b3148 torchtitan/parallelisms/parallelize_llama.py, the code of the
      Dec 2024 benchmark rows);
    * NeMo / Megatron-core where its runtime has ``tp_comm_overlap`` (stated, or inferred by
      ``nemo_recipes.nemo_runtime``): Megatron refuses that overlap without sequence parallelism
      (Megatron-LM megatron/training/arguments.py: "Tensor parallel communication/GEMM overlap can
      happen only when sequence parallelism is enabled"), the rule ``cp_runs.nemo_long_sequence_plan``
      applies to the long-sequence rows.

    Before this rule every such row held whole-sequence activations on each tp rank and 8 runs that
    ran (NeMo GPT-3 175B / Nemotron-4 340B / Llama 3.1 405B, the torchtitan 405B cp sweep) were
    predicted not to fit."""
    if tp <= 1:
        return False
    if r["sequence_parallel"].startswith("true"):
        return True
    if stack == "fsdp":
        return True
    return stack == "megatron" and "tp_comm_overlap" in runtime


def _why_not(r) -> str:
    fw = r["framework"]
    if "JAX" in fw:
        return "JAX stack (MaxText / Paxml): no autopar runtime profile"
    if r["precision"] not in ("fp8", "mxfp8"):
        return f"precision {r['precision']} not planned"
    if _hardware(r["gpu"])[0] is None:
        return "GPU without a profile"
    if _spec(r) is None:
        return "model shape not in the row"
    if not _f(r["micro_batch"]):
        return "micro-batch not published"
    if not (_f(r["step_time_s"]) or _f(r["tokens_per_s_per_gpu"]) or _f(r["speedup_vs_pair"])):
        return "no step time, throughput or speed-up published"
    return ""


def with_scale(profile, stack: str, scale: float):
    """``profile`` with ``stack``'s FP8 matmul scale set to ``scale`` (what the fit varies)."""
    rest = tuple((k, v) for k, v in profile.fp8_matmul_scale if k != stack)
    return dataclasses.replace(profile, fp8_matmul_scale=rest + ((stack, scale),))


def run_table(run: Fp8Run, table_of):
    """The run's layer table: an ``hf:`` config traced at the row's sequence (its own default
    is 2048; ``open_runs.predict`` does the same), a family spec as it names its seq."""
    return table_of(run.spec, seq=run.seq) if run.spec.startswith("hf:") and run.seq else table_of(run.spec)


def predict(run: Fp8Run, table_of, profile) -> dict:
    """Predicted FP8 and BF16 step of ``run`` on ``profile`` (``table_of(spec) -> LayerTable``);
    ``{"error": ...}`` with a reason when the plan is refused."""
    from costmodels.model.estimate import estimate
    if run.hbm_bytes:
        profile = dataclasses.replace(profile, hbm_bytes=run.hbm_bytes)
    table = run_table(run, table_of)
    try:
        e8 = [estimate(table, profile, p, run.gpus, run.global_batch) for p in run.plans]
        b16 = [estimate(table, profile, p, run.gpus, run.global_batch).step_time_s for p in run.bf16_plans]
    except PlanError as e:
        return {"run": run, "refused": str(e)}
    f8 = [e.step_time_s for e in e8]
    s8, s16 = sum(f8) / len(f8), sum(b16) / len(b16)
    out = {"run": run, "fp8_s": s8, "bf16_s": s16, "speedup": s16 / s8,
           # the run ran: it fits if any reading of its plan (none / full for a partial policy) fits
           "fits": any(e.fits for e in e8), "memory_gib": min(e.memory_bytes["total"] for e in e8) / 2 ** 30}
    if run.published_step_s:
        out["error"] = s8 / run.published_step_s - 1
    if run.published_memory_gib:
        mems = [e.memory_bytes["total"] / 2 ** 30 for e in e8]
        if len(mems) == 2:   # a partial policy (none, full): every one here is torchtitan's / torchao's
            # op-level one (per-op SAC; torchtitan's llama3_8b.toml selective_ac_option = 'op'),
            # read as open_runs reads it: full + op share of what recompute saves
            from costmodels.calibration.open_runs import op_policy_share
            mems = [mems[1] + op_policy_share(table) * (mems[0] - mems[1])]
        out["memory_error"] = mems[0] / run.published_memory_gib - 1
        out["memory_mean_gib"] = mems[0]
    if run.published_speedup:
        out["speedup_error"] = out["speedup"] / run.published_speedup - 1
    return out


def fit_scale(runs: list[Fp8Run], table_of, profile, stack: str) -> float:
    """The scale minimising the squared log error of the predicted speed-up over ``runs``
    (golden-section search on [0.3, 1.5])."""
    def loss(s):
        prof = with_scale(profile, stack, s)
        return sum(math.log(predict(r, table_of, prof)["speedup"] / r.published_speedup) ** 2 for r in runs)
    lo, hi = 0.3, 1.5
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(18):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    return round((lo + hi) / 2, 3)
