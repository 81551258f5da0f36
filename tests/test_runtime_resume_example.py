"""Elastic resume end to end with examples/train_gpt.py: a run on 4 ranks (dp2·pp2) saves at
step 4 and goes on to step 6; ``autopar replan`` finds the best plan for 2 GPUs; a second run
on 2 ranks under that plan resumes from the checkpoint, and its steps 5 and 6 print the losses
of the uninterrupted run (same weights, optimizer state resharded, same data order)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
MODEL = "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32,dropout=0"


def _run(args):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _losses(out: str) -> dict[int, str]:
    return {int(s): loss for s, loss in re.findall(r"step\s+(\d+)\s+loss (\S+)", out)}


def test_save_on_4_ranks_replan_resume_on_2(tmp_path):
    ckpt, plans = str(tmp_path / "ckpt_{step}"), str(tmp_path / "replan.json")
    first = _run([TORCHRUN, "--nproc-per-node", "4", "examples/train_gpt.py", "--model", MODEL,
                  "--plan", '{"dp": 2, "pp": 2}', "--global-batch", "8", "--steps", "6",
                  "--save", ckpt, "--save-every", "4", "--log-every", "1"])
    step4 = ckpt.replace("{step}", "4")
    assert f"saved step 4 to {step4}" in first
    _run([sys.executable, "-m", "autopar.cli.main", "replan", step4, "--gpus", "2",
          "--hardware", "a100-80g-sxm", "-o", plans, "--time-limit", "20"])
    resumed = _run([TORCHRUN, "--nproc-per-node", "2", "examples/train_gpt.py", "--plan", plans,
                    "--steps", "6", "--resume", step4, "--log-every", "1"])
    assert "steps 5..6 (resumed from" in resumed, resumed
    whole, part = _losses(first), _losses(resumed)
    assert part.keys() == {5, 6} and all(part[s] == whole[s] for s in (5, 6)), (whole, part)
