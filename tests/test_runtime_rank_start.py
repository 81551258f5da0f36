"""How ``serial.spawn`` starts ranks (autopar/runtime/verify/rank_start.py): ``spawn`` for users
unless ``AUTOPAR_RANK_START=forkserver``; under the fork server a rank sees the caller's
environment, working directory, stdout and stderr of the moment it starts, not the server's. (The user's
``spawn`` path runs in tests/test_runtime_cli.py::test_verify_pipeline_plan_from_a_plans_file.)"""
from __future__ import annotations

import os
import sys

import pytest

from autopar.runtime.verify import rank_start


@pytest.mark.parametrize("value, method", [(None, "spawn"), ("spawn", "spawn"), ("fork", "spawn"),
                                           ("forkserver", "forkserver"), (" ForkServer ", "forkserver")])
def test_start_method_is_spawn_unless_forkserver_is_asked(monkeypatch, value, method):
    if value is None:
        monkeypatch.delenv(rank_start.START_ENV, raising=False)
    else:
        monkeypatch.setenv(rank_start.START_ENV, value)
    assert rank_start.start_method() == method
    assert (rank_start.rank_environment(method) is None) == (method == "spawn")


def _what_the_rank_sees(say=True):
    if say:
        print(f"rank {os.environ['RANK']} says hello", flush=True)
    return (os.environ.get("AUTOPAR_TEST_RANK_START_SET"), os.environ.get("AUTOPAR_TEST_RANK_START_GONE"),
            os.environ["RANK"], os.getcwd(), os.getppid(), "autopar.runtime.apply" in sys.modules)


def test_forkserver_ranks_see_the_callers_environment_of_now(monkeypatch, tmp_path, capfd):
    from autopar.runtime.verify.serial import spawn
    monkeypatch.setenv(rank_start.START_ENV, "forkserver")
    monkeypatch.setenv("AUTOPAR_TEST_RANK_START_GONE", "1")
    with capfd.disabled():                   # the server is up (or was already) with GONE set,
        spawn(_what_the_rank_sees, 1, False)  # and the stdout of its start is not this test's
    monkeypatch.delenv("AUTOPAR_TEST_RANK_START_GONE")
    monkeypatch.setenv("AUTOPAR_TEST_RANK_START_SET", "yes")
    monkeypatch.chdir(tmp_path)
    seen = spawn(_what_the_rank_sees, 2)
    assert [s[:4] for s in seen] == [("yes", None, "0", str(tmp_path)), ("yes", None, "1", str(tmp_path))]
    assert seen[0][4] == seen[1][4] != os.getpid()   # both forked by the one server
    assert seen[0][5] and seen[1][5]                 # with autopar's runner already imported
    out = capfd.readouterr().out                      # and print to this test's stdout
    assert "rank 0 says hello" in out and "rank 1 says hello" in out, out
