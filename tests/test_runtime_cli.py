"""`autopar verify` end to end (spawns its own 2 gloo ranks), examples/train_gpt.py under
torchrun (a loss that falls; a refused plan printed once), and a rank that dies or freezes
mid-step named in the survivor's one line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from world_prefetch import Job, result

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _run(args, timeout=240):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_verify_pipeline_plan_from_a_plans_file(tmp_path, capsys, monkeypatch):
    """``autopar verify`` (its ``main``, in this process: the ranks it spawns are the processes
    under test; the ``python -m autopar.cli.main`` entry is the torchrun tests' below). Its ranks
    start as a user's do, each a fresh interpreter (``spawn``), not from the suite's fork server."""
    from autopar.cli.main import main
    monkeypatch.setenv("AUTOPAR_RANK_START", "spawn")
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"version": 1, "model": "x", "global_batch": 4, "plans": [
        {"pp": 2, "schedule": "gpipe", "micro_batch_size": 1, "rank": 1}]}))
    code = main(["verify", "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8,tied=true", "--plan",
                 str(plans), "--steps", "3", "--json"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr[-2000:]
    out = json.loads(stdout)
    assert out["ok"] and out["global_batch"] == 4 and len(out["parallel"]) == 3
    assert out["max_rel_diff"] <= 1e-5


def test_verify_errors_are_one_line(capsys):
    from autopar.cli.main import main
    code = main(["verify", "gpt2-small", "--plan", '{"dp": 3}', "--nproc", "2"])
    _, stderr = capsys.readouterr()
    assert code == 2 and stderr.count("\n") == 1
    assert "--nproc 2 != dp·cp·tp·pp" in stderr


def torchrun_examples() -> dict:
    """The two ``torchrun`` launches of examples/train_gpt.py below (fresh interpreters, nothing
    timed), run ahead in the suite's prefetch helper (tests/world_prefetch.py): ``train``, 30
    steps under dp2 ZeRO-2, and ``refused``, a plan refused before launch, with each rank's
    stderr log (``logs``: local rank -> text)."""
    import glob
    import tempfile
    train = _run([os.path.join(BIN, "torchrun"), "--nproc-per-node", "2",
                  "examples/train_gpt.py", "--plan", '{"dp": 2, "zero": 2}', "--steps", "30",
                  "--model", "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32,dropout=0"])
    with tempfile.TemporaryDirectory() as logs:
        refused = _run([os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", "--log-dir", logs,
                        "--redirects", "3", "examples/train_gpt.py", "--plan", '{"tp": 2}',
                        "--model", "gpt:layers=2,hidden=48,heads=3,vocab=256,seq=16"])
        err = {int(p.split(os.sep)[-2]): open(p).read()
               for p in glob.glob(os.path.join(logs, "*", "attempt_0", "*", "stderr.log"))}
    return dict(train=train, refused=refused, logs=err)


PREFETCH_WORLD = Job(torchrun_examples)


@pytest.fixture(scope="module")
def examples():
    return result(__name__, PREFETCH_WORLD)


def test_train_gpt_example_loss_falls(examples):
    r = examples["train"]
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(falling)" in r.stdout, r.stdout


def _launch_rank(rank, world, port, *args, **env):
    """One rank of a ``world``-process run started the way a launcher starts it."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "RANK": str(rank), "LOCAL_RANK": str(rank),
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **env}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_dead_or_frozen_rank_is_named_in_one_line():
    """Rank 1 of a 2-rank pipeline dies (SIGKILL) or freezes (SIGSTOP) in its third step's
    forward; the survivor's uncaught error is one line naming rank 1, the operation and
    AUTOPAR_COLLECTIVE_TIMEOUT (8 s: the frozen case ends soon, and start-up skew
    between the two ranks on a loaded host stays well inside it)."""
    from autopar.runtime.verify.serial import free_port
    runs = {}
    for how in ("kill", "stop"):
        port = free_port()
        runs[how] = [_launch_rank(r, 2, port, "tests/fixtures/dead_peer.py", how,
                                  AUTOPAR_COLLECTIVE_TIMEOUT="8") for r in (0, 1)]
    try:
        for how, (survivor, _victim) in runs.items():
            out, err = survivor.communicate(timeout=240)
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert survivor.returncode == 1 and len(lines) == 1, err[-3000:]
            assert "autopar: error: rank 1 stopped answering during train_step" in lines[0], lines
            assert "AUTOPAR_COLLECTIVE_TIMEOUT=8 s" in lines[0]
            assert ("connection closed" if how == "kill" else "no reply within") in lines[0]
    finally:
        for procs in runs.values():
            for p in procs:
                p.kill()
                p.communicate()


def test_torchrun_prints_a_refused_plan_once(examples):
    """A plan refused before launch, under torchrun: rank 0's log holds the one line and rank 0
    exits 1; rank 1's log holds nothing (it waits, quiet, for torchrun to end it). torchrun's own
    summary of the failed ranks follows on its stderr."""
    r, err = examples["refused"], examples["logs"]
    assert r.returncode != 0 and sorted(err) == [0, 1], (r.stderr[-2000:], err)
    assert err[0] == "autopar: error: plan field 'tp'=2 does not divide heads=3; choose tp in [1, 3]\n"
    assert err[1] == ""
    assert re.search(r"rank +: 0 \(local_rank: 0\)\s+exitcode +: 1 ", r.stderr), r.stderr
