"""How the CLI ends and what it prints: SIGINT / SIGTERM stop a running search with one line and
no output file, an unwritable stdout is one line, a closed pipe is quiet, tables are never cut
to '…' off a terminal, a GPU count printed is the plan's own, progress goes to stderr only."""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autopar.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G256 = os.path.join(ROOT, "tests", "fixtures", "report", "g256.json")
# a search that is cheap to start and long to finish: ~10k configurations enumerated in about a
# second of CPU (its first "configurations" progress line), then CP-SAT splits for well over ten
# seconds, since --top 1000 asks for more distinct plans than it has. (llama3-70b on 4096 GPUs,
# used before, spent ~21 s of CPU per process enumerating 682k configurations before that line.)
LONG_SEARCH = ["search", "llama3-8b", "--hardware", "h100-80g-sxm", "--gpus", "64", "--global-batch",
               "256", "--top", "1000", "--progress"]


def cli(*argv, **kw):
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONWARNINGS": "ignore"}
    return [sys.executable, "-m", "autopar.cli.main", *argv], dict(cwd=ROOT, env=env, **kw)


@pytest.mark.slow
def test_a_signal_stops_a_running_search_with_one_line_and_no_file(tmp_path):
    """Started the way a script starts a background job (SIGINT ignored), signalled once the
    solver is running: exits promptly, one line, no plans file, nothing on stdout. SIGINT (130)
    and SIGTERM (143) each stop their own search; the two run side by side, so the suite waits
    for one solver start-up, not two."""
    import threading
    runs = {}
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        folder = tmp_path / signal.Signals(sig).name
        folder.mkdir()
        args, kw = cli(*LONG_SEARCH, "-o", str(folder / "plans.json"))
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), **kw)
        runs[sig] = dict(p=p, code=code, folder=folder, seen=[])

    def signal_when_solving(run, sig):
        for line in run["p"].stderr:            # wait until the search itself reports progress
            run["seen"].append(line)
            if "configurations" in line:
                break
        run["running"] = run["p"].poll() is None
        run["t0"] = time.monotonic()
        run["p"].send_signal(sig)
        run["out"], rest = run["p"].communicate(timeout=60)
        run["took"] = time.monotonic() - run["t0"]
        run["err"] = rest

    threads = [threading.Thread(target=signal_when_solving, args=(run, sig)) for sig, run in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    try:
        for sig, run in runs.items():
            assert run.get("running"), "".join(run["seen"])
            assert run["p"].returncode == run["code"], run["err"]
            # promptly: an ignored signal leaves the search running for minutes; 30 s leaves room
            # for two interpreters exiting at once on a loaded 2-core host (15.4 s was seen)
            assert run["took"] < 30
            assert run["err"].strip().splitlines() == [f"autopar: interrupted ({signal.Signals(sig).name})"]
            assert run["out"] == "" and os.listdir(run["folder"]) == []
    finally:
        for run in runs.values():
            if run["p"].poll() is None:
                run["p"].kill()
                run["p"].communicate()


def test_an_unwritable_stdout_is_one_line_and_a_closed_pipe_is_quiet():
    args, kw = cli("hardware", "--json")
    with open("/dev/full", "w") as full:
        r = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, **kw)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "autopar: error: cannot write the output (No space left on device); redirect it to a file "
        "on a disk with free space"]
    p = subprocess.Popen(args[:-1], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    p.stdout.close()                            # the reader went away (| head)
    assert p.wait(timeout=120) == 0 and p.stderr.read() == ""


def test_tables_keep_whole_names_when_piped(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")          # what rich assumes off a terminal
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for name in ("a100-80g-sxm", "NVIDIA A100-SXM4-80GB", "2-core AMD EPYC (KVM guest), torch CPU",
                 "inter-node/GPU"):
        assert name in out
    assert max(len(line) for line in out.splitlines()) > 80


def gpu_count_plans() -> dict:
    """A throughput-per-GPU search's file: the winner on 112 GPUs, the runner-up on 96."""
    data = json.load(open(G256))
    data = copy.deepcopy(data)
    data["objective"], data["gpus"] = "throughput_per_gpu", 1024
    for p, n in zip(data["plans"], (112, 96, 96)):
        p["gpus"] = n
    return data


def test_search_table_names_each_plan_s_gpu_count(capsys):
    from autopar.cli.search import print_table
    data = gpu_count_plans()
    print_table(data)
    out = capsys.readouterr().out
    assert "on 96–112 (up to 1024) ×" in out and "on 1024 ×" not in out
    header = next(line for line in out.splitlines() if " dp " in line)
    assert "GPUs" in header
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [r.split("│")[2].strip() for r in rows] == ["112", "96", "96"]
    for p in data["plans"]:
        p["gpus"] = 112
    print_table(data)
    out = capsys.readouterr().out
    assert "on 112 × (of up to 1024)" not in out and "on 112 (of up to 1024) ×" in out
    assert "GPUs" not in next(line for line in out.splitlines() if " dp " in line)


def test_progress_goes_to_stderr_only_when_asked_or_on_a_terminal(capsys):
    import argparse

    from autopar.cli.common import progress, wants_progress
    quiet, asked = argparse.Namespace(command="inspect"), argparse.Namespace(command="inspect", progress=True)
    assert not wants_progress(quiet) and wants_progress(asked)   # capsys: stderr is no terminal
    with progress(quiet, "tracing x", after_s=0.0):
        time.sleep(0.3)
    assert capsys.readouterr() == ("", "")
    with progress(asked, "tracing x", after_s=0.0):
        time.sleep(0.3)
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("autopar inspect: tracing x … ")


def test_an_interrupt_stops_the_ranks_a_command_spawned():
    """verify / validate / profile spawn ranks; SIGTERM reaches only autopar itself, so main
    stops them (else Python's exit waits for them to finish their steps)."""
    import multiprocessing

    from autopar.cli.main import stop_children
    p = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,))
    p.start()
    t0 = time.monotonic()
    stop_children()
    assert not p.is_alive() and time.monotonic() - t0 < 10
