"""A killed rank is one ``autopar:`` line naming it and what it was doing: under ``autopar
verify``'s launcher (``spawn``: torch.multiprocessing's ``ProcessExitedException`` was an
``internal error``), and under torchrun, where the surviving rank prints it before torchrun's
summary (torchrun used to end the job with its summary alone). A rank that exits after printing
its own error is not reported as killed (a refused plan is printed once)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from world_prefetch import Job, result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def test_verify_launcher_names_a_killed_rank_and_its_operation():
    from autopar.runtime.faults.rank_exit import RankDiedError
    from autopar.runtime.verify.serial import spawn
    sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
    try:
        from killed_rank import killed_in_second_step
        with pytest.raises(RankDiedError) as e:
            spawn(killed_in_second_step, 2)
    finally:
        sys.path.remove(os.path.join(ROOT, "tests", "fixtures"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rank 1 was killed by SIGKILL during train_step"), msg


def test_cli_prints_a_dead_verify_rank_in_one_line(monkeypatch, capsys):
    """The CLI's handler: RankDiedError is an AutoparError, one line, exit 2 (not 'internal error')."""
    import autopar.runtime.verify.serial as serial
    from autopar.cli.main import main
    from autopar.runtime.faults.rank_exit import rank_died

    class ProcessExitedException(Exception):   # torch.multiprocessing's, as spawn raises it
        error_index, signal_name, exit_code = 1, "SIGKILL", -9

    def dies(*args, **kwargs):
        raise rank_died(ProcessExitedException("process 1 terminated with signal SIGKILL"), None,
                        "autopar verify's steps")

    monkeypatch.setattr(serial, "spawn", dies)
    rc = main(["verify", "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8", "--plan", '{"pp": 2}',
               "--steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "internal error" not in err, err
    assert err.startswith("autopar: error: rank 1 was killed by SIGKILL during autopar verify's steps")


def torchrun_with_a_killed_rank() -> tuple[int, str]:
    """``torchrun`` of tests/fixtures/dead_peer.py whose rank 1 is killed: (exit code, stderr).
    Run ahead in the suite's prefetch helper (tests/world_prefetch.py): three fresh interpreters,
    nothing timed."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    r = subprocess.run([os.path.join(BIN, "torchrun"), "--nproc-per-node", "2",
                        "tests/fixtures/dead_peer.py", "kill"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
    return r.returncode, r.stderr


PREFETCH_WORLD = Job(torchrun_with_a_killed_rank)


@pytest.mark.slow
def test_torchrun_survivor_names_the_killed_rank_before_torchruns_summary():
    returncode, stderr = result(__name__, PREFETCH_WORLD)
    assert returncode != 0
    ours = [ln for ln in stderr.splitlines() if ln.startswith("autopar:")]
    assert len(ours) == 1, stderr[-3000:]
    assert ours[0].startswith("autopar: error: rank 1 died or was killed during train_step"), ours
    assert stderr.index(ours[0]) < stderr.index("Failures:"), stderr[-3000:]
