"""``autopar export`` says the plan's predicted step time under the target trainer's runtime
profile, and warns in one line when another plan of the file is faster under it (a plan best only
for the runtime it was searched under is not exported silently)."""
from __future__ import annotations

import json

MODEL = "gpt:layers=4,hidden=64,heads=8,vocab=256,seq=64,dropout=0"


def _plans(tmp_path) -> str:
    data = {"version": 1, "model": MODEL, "hardware": "a100-80g-sxm", "gpus": 8, "global_batch": 32,
            "seq": 64, "plans": [{"dp": 4, "pp": 2, "micro_batch_size": 2, "zero": 1},
                                 {"dp": 8, "micro_batch_size": 4, "zero": 1}]}
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_export_prices_the_plan_under_the_target_and_warns_of_a_faster_one(tmp_path, capsys):
    from autopar.cli.main import main
    from autopar.scoring import estimate_plans
    plans = _plans(tmp_path)
    t = {i + 1: d["step_time_s"] for i, d in enumerate(estimate_plans(
        MODEL, "a100-80g-sxm", 8, 32, plans, runtime="megatron"))}
    slow, fast = (1, 2) if t[1] > t[2] else (2, 1)
    assert t[slow] > 1.01 * t[fast]          # the two plans differ under megatron's profile
    out = str(tmp_path / "megatron.sh")
    assert main(["export", plans, "--to", "megatron", "--index", str(slow), "-o", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"plan #{slow} ") and f"{t[slow]:.3g} s/step predicted under " \
        "megatron's runtime profile (megatron)" in lines[1], lines
    assert lines[2].startswith(f"warning: plan #{fast} of {plans}") and f"{t[fast]:.3g} s/step" in lines[2]
    assert main(["export", plans, "--to", "megatron", "--index", str(fast)]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and f"plan #{fast} " in captured.err   # notes: stderr
    assert captured.out.startswith("#!/bin/bash") and "plan #" not in captured.out   # the file: stdout
