"""``autopar export`` keeps its promises: launch lines that run (seq= once, the script and every
pasted value shell-quoted), the plan checked against the model with the pre-launch check
``apply`` uses, absurd flags refused, ``--index`` counted from 1 as the tables count; and the
input rules ``replan``, ``apply --emit`` and ``-o`` share. Every refusal is one line, exit 2,
nothing written. The exported torchrun line is launched (2 gloo ranks, 2 steps) by a slow test."""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "gpt:layers=2,hidden=48,heads=6,vocab=256,seq=12,dropout=0"


def _plans_file(tmp_path, plans, model=MODEL, global_batch=4) -> str:
    """A plans file as 'autopar search -o' writes it (header, plans best first)."""
    data = {"version": 1, "model": model, "hardware": "a100-80g-sxm", "gpus": 2,
            "global_batch": global_batch, "seq": 12, "objective": "step_time", "optimal": True,
            "plans": [dict(p, step_time_s=0.01 * (i + 1)) for i, p in enumerate(plans)]}
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(data))
    return str(path)


def _refused(capsys, argv, needle):
    from autopar.cli.main import main
    rc = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert needle in lines[0], lines[0]
    assert captured.out == ""
    return lines[0]


def _export(capsys, argv) -> str:
    from autopar.cli.main import main
    assert main(["export", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _launch_words(text: str) -> list[str]:
    """The torchrun command of an exported script, as the shell splits it."""
    line = text.split("torchrun ", 1)[1].replace("\\\n", " ")
    return shlex.split(line.replace('"$@"', ""))


def test_seq_said_once_and_script_quoted(tmp_path, capsys):
    plans = _plans_file(tmp_path, [{"dp": 2, "micro_batch_size": 2}])
    evil = "x.py\n; touch pwned"
    out = _export(capsys, [plans, "--to", "torchrun", "--script", evil])
    words = _launch_words(out)
    model = words[words.index("--model") + 1]
    assert model.count("seq=") == 1 and "seq=12" in model, model
    assert evil in words and "touch" not in [w for w in words if w != evil]
    from autopar.models import load_model
    assert load_model(model).seq == 12     # the spec parser takes what was written
    r = subprocess.run(["bash", "-n"], input=out, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("plan, batch, needle", [
    ({"tp": 5}, 4, "'tp'=5 does not divide heads=6"),
    ({"dp": 3}, 4, "global batch 4 is not divisible by dp·micro_batch_size = 3·1"),
    ({"pp": 2, "stages": [[0, 2], [2, 3]]}, 4, "'stages' ends at row 3"),
    ({"runtime": "nonexistent"}, 4, "unknown runtime 'nonexistent'"),
    ({"runtime": "megatron:nooption"}, 4, "has no option 'nooption'"),
])
@pytest.mark.parametrize("target", ["torchrun", "megatron"])
def test_plan_checked_against_the_model_before_export(tmp_path, capsys, plan, batch, needle, target):
    out = str(tmp_path / "launch.sh")
    _refused(capsys, ["export", json.dumps(plan), "--to", target, "--model", MODEL,
                      "--global-batch", str(batch), "-o", out], needle)
    assert not os.listdir(tmp_path)


def test_another_models_plans_file_is_refused(tmp_path, capsys):
    plans = _plans_file(tmp_path, [{"dp": 2}], model="gpt3-175b")
    _refused(capsys, ["export", plans, "--to", "torchrun", "--model", MODEL],
             "is a plans file for gpt3-175b, not")


@pytest.mark.parametrize("flags, needle", [
    (["--global-batch", "0"], "--global-batch: 0 must be at least 1"),
    (["--seq", "-1"], "--seq: -1 must be at least 1"),
    (["--gpus-per-node", "0"], "--gpus-per-node: 0 must be at least 1"),
    (["--gpus-per-node", "3"], "--gpus-per-node 3 does not cut the plan's 8 GPUs into whole nodes"),
    (["--index", "0"], "--index counts from 1"),
    (["--index", "3"], "holds 2 plan(s): give 1 to 2"),
])
def test_export_flags_refused(tmp_path, capsys, flags, needle):
    plans = _plans_file(tmp_path, [{"dp": 8}, {"dp": 4, "tp": 2}], global_batch=8)
    _refused(capsys, ["export", plans, "--to", "torchrun", *flags], needle)


def test_index_counts_from_one_as_the_tables(tmp_path, capsys):
    plans = _plans_file(tmp_path, [{"dp": 2}, {"tp": 2}])
    assert '"dp":2' in _export(capsys, [plans, "--to", "torchrun", "--index", "1"])
    assert '"tp":2' in _export(capsys, [plans, "--to", "torchrun", "--index", "2"])
    assert '"dp":2' in _export(capsys, [plans, "--to", "torchrun"])        # default: the best


def test_verify_and_emit_refuse_an_unknown_runtime_and_index_0(tmp_path, capsys):
    _refused(capsys, ["verify", MODEL, "--plan", '{"runtime": "nonexistent"}', "--steps", "1"],
             "unknown runtime 'nonexistent'")
    _refused(capsys, ["apply", MODEL, "--plan", '{"runtime": "megatron:nooption"}', "--emit",
                      str(tmp_path / "emit")], "has no option 'nooption'")
    plans = _plans_file(tmp_path, [{"dp": 2}])
    _refused(capsys, ["verify", MODEL, "--plan", plans, "--index", "0"], "--index counts from 1")


@pytest.mark.parametrize("emit, needle", [
    ("missing/x", "missing' does not exist"),
    (".", "holds other files ('notes.txt', 1 in all)"),    # as '--emit /' or '--emit ~' would
])
def test_emit_never_makes_parents_nor_writes_into_a_full_folder(tmp_path, capsys, emit, needle):
    (tmp_path / "notes.txt").write_text("the user's own file\n")
    _refused(capsys, ["apply", MODEL, "--plan", "{}", "--emit", str(tmp_path / emit)], needle)
    assert os.listdir(tmp_path) == ["notes.txt"]


@pytest.mark.parametrize("flags, needle", [
    (["--gpus", "99999999999999999999"], "above autopar's limit"),
    (["--time-limit", "nan"], "must be a finite number"),
    (["--time-limit", "-1"], "must be a finite number"),
    (["--time-limit", "inf"], "must be a finite number"),
    (["--global-batch", "0"], "0 must be at least 1"),
    (["-o", "MISSING/replan.json"], "missing' does not exist"),
    (["-o", "OUT/"], "a path ending in '/' names a folder"),
])
def test_replan_input_rules_before_reading_or_searching(tmp_path, capsys, flags, needle, monkeypatch):
    """The checkpoint does not exist: each refusal comes before it is read (and before a search)."""
    monkeypatch.chdir(tmp_path)
    flags = [f.replace("OUT", str(tmp_path / "out.json")).replace("MISSING", str(tmp_path / "missing"))
             for f in flags]
    argv = ["replan", str(tmp_path / "no-such-ckpt"), "--gpus", "2", "--hardware", "a100-80g-sxm", *flags]
    _refused(capsys, argv, needle)
    assert not os.listdir(tmp_path)


def test_output_path_with_a_trailing_slash_is_refused(tmp_path, capsys):
    out = str(tmp_path / "out.json") + "/"
    _refused(capsys, ["search", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "2",
                      "--global-batch", "4", "-o", out], "a path ending in '/' names a folder")
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_exported_torchrun_line_trains_two_steps(tmp_path, capsys):
    """The exported script, run as is (2 gloo ranks on this machine), trains 2 steps."""
    plans = _plans_file(tmp_path, [{"dp": 2, "micro_batch_size": 2}])
    script = str(tmp_path / "torchrun.sh")
    from autopar.cli.main import main
    assert main(["export", plans, "--to", "torchrun", "-o", script,
                 "--script", os.path.join(ROOT, "examples", "train_gpt.py")]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "JOB_ID": "t",
           "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    r = subprocess.run(["bash", script, "--steps", "2", "--log-every", "1"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^step\s+2\s+loss", r.stdout, re.M) and "plan dp2·" in r.stdout, r.stdout
