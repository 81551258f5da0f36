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


def _dies_or_waits(spec):
    """Rank 1 leaves after apply; rank 0's train_step must fail, not hang."""
    import time

    import torch.distributed as dist

    import autopar
    from autopar.models import load_model
    source = load_model(spec)
    runner = autopar.apply(source.build("cpu"), autopar.Plan(dp=2), loss_fn=source.loss,
                           timeout_s=5)
    if dist.get_rank() == 1:
        return "left"
    time.sleep(1)
    x, y = source.make_batch(2)
    t = time.monotonic()
    try:
        runner.train_step(x[0][:1], y[:1])
        return "no error"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} after {time.monotonic() - t:.1f}s"


def test_a_dead_rank_ends_the_others_with_an_error():
    from autopar.runtime.verify import spawn
    res = spawn(_dies_or_waits, 2, "gpt:layers=1,hidden=16,heads=2,vocab=32,seq=4")
    assert res[1] == "left"
    assert res[0] != "no error" and "Error" in res[0], res[0]
    assert float(res[0].split(" after ")[1][:-1]) < 30
