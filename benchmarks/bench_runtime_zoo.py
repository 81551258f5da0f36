"""The model matrix of the README: models people train, as written, under every kind of plan.

    python benchmarks/bench_runtime_zoo.py [--steps 3] [--only MODEL,...] [--json OUT]

Models (tests/fixtures/zoo.py, all built from configs or written here): transformers GPT-2,
Llama, Qwen2, BERT for masked LM, ViT for image classification and Mixtral; a nanoGPT-shaped and
a minGPT-shaped model (``forward(idx, targets=None) -> (logits, loss)``), a torchtitan-style Llama
(``ModuleDict`` blocks, fused-qkv state-dict hook), a ViT in timm's layout. Plans: dp2; tp2;
tp2 + sequence parallel; pp2 with 2 and 4 micro-batches; vpp2 (interleaved 1F1B); dp2·pp2 with
ZeRO 0–3; recompute full and selective. ``--more``: the second shelf (issue 33: Gemma-2, BLOOM,
DeBERTa-v2, Falcon, RoBERTa, Phi-3, OLMo-2, OPT, GPT-NeoX, StableLM, Starcoder2, Qwen3, Gemma, T5,
a torchvision-layout ResNet, a timm-layout ConvNeXt, ``nn.MultiheadAttention`` blocks) under the
seven plans dp2, pp2, tp2, tp2+sp, dp2·ZeRO-3, tp2·pp2 and pp2 with selective recompute.

Each cell is what ``autopar verify MODEL --plan P`` checks — the runtime's pre-launch check, then
``--steps`` SGD steps of ``autopar.apply`` against the single-process model on the same data —
run for all cells in shared gloo worlds (``autopar.runtime.verify.sweep.run``): ``✓`` with the largest
relative loss difference when losses agree within 1e-5 and every parameter of
``full_state_dict`` within 1e-4, else the one line the runtime printed. Prints the matrix as
Markdown (what the README shows) and the distinct refusal lines; exits 1 when a cell failed
(a mismatch or an error; a refusal with its line is an answer, not a failure).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from autopar.runtime.verify import sweep  # noqa: E402

MODELS = {"gpt2": "HF GPT-2", "llama": "HF Llama", "qwen2": "HF Qwen2", "bert": "HF BERT (MLM)",
          "vit": "HF ViT", "timm_vit": "ViT, timm layout", "nanogpt": "nanoGPT-shaped",
          "mingpt": "minGPT-shaped", "titan_llama": "torchtitan-style Llama", "mixtral": "HF Mixtral (MoE)"}
# the second shelf (issue 33: tests/fixtures/zoo_more.py), run with the seven plans (--plans seven)
MORE = {"gemma2": "HF Gemma-2", "gemma": "HF Gemma (tied)", "bloom": "HF BLOOM", "deberta_v2": "HF DeBERTa-v2 (MLM)",
        "falcon": "HF Falcon", "roberta": "HF RoBERTa (MLM)", "phi3": "HF Phi-3", "olmo2": "HF OLMo-2",
        "opt": "HF OPT", "gpt_neox": "HF GPT-NeoX", "stablelm": "HF StableLM", "starcoder2": "HF Starcoder2",
        "qwen3": "HF Qwen3", "t5": "HF T5", "resnet": "ResNet, torchvision layout",
        "convnext": "ConvNeXt, timm layout", "mha": "nn.MultiheadAttention blocks",
        "mingpt_lambda": "minGPT as written (lambda MLP)"}
NAMES = {**MODELS, **MORE}
PLANS = [
    ("dp2", dict(dp=2), 2), ("tp2", dict(tp=2), 2), ("tp2+sp", dict(tp=2, sequence_parallel=True), 2),
    ("pp2 m2", dict(pp=2, schedule="1f1b"), 2), ("pp2 m4", dict(pp=2, schedule="1f1b"), 4),
    ("vpp2", dict(pp=2, vpp=2, schedule="interleaved-1f1b"), 4),
    *[(f"dp2·pp2 Z{z}", dict(dp=2, pp=2, zero=z), 4) for z in range(4)],
    ("recompute full", dict(recompute="full"), 2), ("recompute sel.", dict(recompute="selective"), 2),
]
# issue 33's seven plans; one micro-batch per dp rank where the plan has no pipeline (a BatchNorm
# model then trains the serial model under dp: gradient accumulation would not)
SEVEN = [
    ("dp2", dict(dp=2), 1), ("pp2", dict(pp=2, schedule="1f1b"), 2), ("tp2", dict(tp=2), 1),
    ("tp2+sp", dict(tp=2, sequence_parallel=True), 1), ("dp2·ZeRO-3", dict(dp=2, zero=3), 1),
    ("tp2·pp2", dict(tp=2, pp=2, schedule="1f1b"), 2), ("pp2 sel. recompute", dict(pp=2, recompute="selective"), 2),
]


def cases_for(models, plans=None):
    out = []
    for model in models:
        for label, plan, m in plans or PLANS:
            out.append((model, label, sweep.SweepCase(model, tuple(sorted(plan.items())), m)))
    return out


def cell(res: dict, notes: list[str]) -> str:
    if res["status"] == "pass":
        return f"✓ {res['rel']:.0e}"
    line = res.get("line") or f"{res['status']}: loss {res.get('rel')}, params {res.get('param_rel')}"
    if line not in notes:
        notes.append(line)
    mark = "—" if res["status"] == "refused" else "✗"
    return f"{mark} [{notes.index(line) + 1}]"


def render(table, results, models, plans=None) -> tuple[str, list[str]]:
    plans = plans or PLANS
    notes: list[str] = []
    head = "| model | " + " | ".join(label for label, _, _ in plans) + " |"
    lines = [head, "|" + "---|" * (len(plans) + 1)]
    for model in models:
        cells = [cell(results[table[(model, label)].name], notes) for label, _, _ in plans]
        lines.append(f"| {NAMES[model]} | " + " | ".join(cells) + " |")
    return "\n".join(lines), notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated model keys")
    ap.add_argument("--json", default=None, help="write every cell's result here")
    ap.add_argument("--plans", choices=("all", "seven"), default="all",
                    help="'seven': issue 33's dp2, pp2, tp2, tp2+sp, dp2·ZeRO-3, tp2·pp2, pp2 selective "
                         "recompute (default for --more)")
    ap.add_argument("--more", action="store_true", help="the second shelf of models (zoo_more)")
    args = ap.parse_args(argv)
    from zoo_cases import zoo_case
    models = args.only.split(",") if args.only else list(MORE if args.more else MODELS)
    plans = SEVEN if args.plans == "seven" or args.more else PLANS
    entries = cases_for(models, plans)
    t0 = time.monotonic()
    result = sweep.run([c for _, _, c in entries], world=4, steps=args.steps, make_case=zoo_case)
    table = {(model, label): c for model, label, c in entries}
    text, notes = render(table, result.results, models, plans)
    print(text)
    print()
    for i, line in enumerate(notes, 1):
        print(f"[{i}] {line}")
    print(f"\n{len(entries)} cells in {time.monotonic() - t0:.0f} s, {result.worlds} world(s), "
          f"{args.steps} SGD steps each")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{m} | {lab}": result.results[c.name] for m, lab, c in entries},
                                              indent=1, default=str))
    failed = [c.name for _, _, c in entries if result.results[c.name]["status"] not in ("pass", "refused")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
