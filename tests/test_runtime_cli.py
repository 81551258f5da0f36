"""`autopar verify` end to end (spawns its own 2 gloo ranks) and examples/train_gpt.py under
torchrun: a loss that falls."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _run(args, timeout=240):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_verify_pipeline_plan_from_a_plans_file(tmp_path):
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"version": 1, "model": "x", "global_batch": 4, "plans": [
        {"pp": 2, "schedule": "gpipe", "micro_batch_size": 1, "rank": 1}]}))
    r = _run([sys.executable, "-m", "autopar.cli.main", "verify",
              "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8,tied=true", "--plan", str(plans),
              "--steps", "3", "--json"])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["ok"] and out["global_batch"] == 4 and len(out["parallel"]) == 3
    assert out["max_rel_diff"] <= 1e-5


def test_verify_errors_are_one_line():
    r = _run([sys.executable, "-m", "autopar.cli.main", "verify", "gpt2-small",
              "--plan", '{"dp": 3}', "--nproc", "2"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--nproc 2 != dp·tp·pp" in r.stderr


def test_train_gpt_example_loss_falls():
    r = _run([os.path.join(BIN, "torchrun"), "--nproc-per-node", "2",
              "examples/train_gpt.py", "--plan", '{"dp": 2, "zero": 2}', "--steps", "30",
              "--model", "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32,dropout=0"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(falling)" in r.stdout, r.stdout
