"""A seeded generator of bad command lines over every subcommand: numeric flags given what no
integer or finite number in range is, output paths no file can be written at, broken plans,
models and hardware. Each case must end in ONE line ``autopar...: error: ...``, exit 2, nothing
on stdout, no file left in the working folder, and no traceback.

The seed is printed (``pytest -s``) and read from ``AUTOPAR_FUZZ_SEED`` to replay a failure;
the cases are ``main()`` calls in this process (a few hundred run in seconds)."""
from __future__ import annotations

import os
import random

import pytest

CASES = 300
MODEL = "gpt:layers=2,hidden=48,heads=6,vocab=256,seq=12,dropout=0"
HW = ["--hardware", "a100-80g-sxm"]

# values no integer flag with a lower bound of 1 accepts
BAD_INTS = ["0", "-1", "-7", "nan", "inf", "-inf", "abc", "", "1.5", "99999999999999999999",
            "1e3", "0x10", "--", "½", "2**8", "9" * 400]
# values no positive finite number accepts
BAD_FLOATS = ["0", "-1", "nan", "NaN", "inf", "-inf", "infinity", "abc", "", "1e400", "-0", "--"]

# (argv before the bad flag, flag, kind): each command made valid up to the bad flag
NUMERIC = [
    (["search", MODEL, *HW, "--gpus", "2", "--global-batch", "4"], "--top", "int"),
    (["search", MODEL, *HW, "--global-batch", "4"], "--gpus", "int"),
    (["search", MODEL, *HW, "--gpus", "2"], "--global-batch", "int"),
    (["search", MODEL, *HW, "--gpus", "2", "--global-batch", "4"], "--time-limit", "float"),
    (["search", MODEL, *HW, "--gpus", "2", "--global-batch", "4"], "--max-micro-batch", "int"),
    (["search", MODEL, *HW, "--gpus", "2", "--global-batch", "4"], "--target-step-time", "float"),
    (["search", MODEL, *HW, "--gpus", "2", "--global-batch", "4"], "--seq", "int"),
    (["estimate", MODEL, *HW, "--plan", "{}"], "--gpus", "int"),
    (["estimate", MODEL, *HW, "--plan", "{}", "--gpus", "1"], "--global-batch", "int"),
    (["inspect", MODEL], "--seq", "int"),
    (["export", "{}", "--to", "torchrun", "--model", MODEL], "--index", "int"),
    (["export", "{}", "--to", "torchrun", "--model", MODEL], "--global-batch", "int"),
    (["export", "{}", "--to", "torchrun", "--model", MODEL], "--seq", "int"),
    (["export", "{}", "--to", "torchrun", "--model", MODEL], "--gpus-per-node", "int"),
    (["replan", "CKPT", *HW], "--gpus", "int"),
    (["replan", "CKPT", *HW, "--gpus", "2"], "--global-batch", "int"),
    (["replan", "CKPT", *HW, "--gpus", "2"], "--top", "int"),
    (["replan", "CKPT", *HW, "--gpus", "2"], "--time-limit", "float"),
    (["verify", MODEL, "--plan", "{}"], "--steps", "int"),
    (["verify", MODEL, "--plan", "{}"], "--nproc", "int"),
    (["verify", MODEL, "--plan", "{}"], "--global-batch", "int"),
    (["verify", MODEL, "--plan", "{}"], "--lr", "float"),
    (["verify", MODEL, "--plan", "{}"], "--index", "int"),
]
BAD_PATHS = ["{tmp}/missing/dir/out.json", "{tmp}/out.json/", "{tmp}", "", "/proc/version"]
OUTPUTS = [
    ["search", MODEL, *HW, "--gpus", "2", "--global-batch", "4", "-o"],
    ["replan", "CKPT", *HW, "--gpus", "2", "-o"],
    ["export", "{}", "--to", "torchrun", "--model", MODEL, "-o"],
]
BAD_PLANS = ['{"tp": 0}', '{"dp": -1}', '{"zero": 5}', '{"schedule": "nope"}', '{"runtime": ""}',
             "not json", "[]", '{"dp": 1e400}', '{"micro_batch_size": "2"}', '{"pp": true}',
             '{"recompute": "all"}', '{"stages": [[0, 1], [0, 1]]}', '{"nosuchfield": 1}', "{" * 5000]
BAD_MODELS = ["gpt:layers=0", "gpt:layers=-3", "gpt:heads=abc", "nosuchmodel", "gpt:layers=99999",
              "hf:/nonexistent/config.json", "/nonexistent/model.py:build", "gpt:", ":", "",
              "gpt:hidden=1e400", "llama:layers=2,nosuchkey=3"]
BAD_HARDWARE = ["nosuch-gpu", "a100-80g-sxm:7", "a100-80g-sxm:0", "a100-80g-sxm:x", ",", "a:b:c",
                "/nonexistent.toml"]


def _case(rng: random.Random, tmp: str) -> list[str]:
    kind = rng.choice(["numeric", "numeric", "numeric", "output", "plan", "model", "hardware"])
    if kind == "numeric":
        argv, flag, what = rng.choice(NUMERIC)
        value = rng.choice(BAD_INTS if what == "int" else BAD_FLOATS)
        return [*argv, f"{flag}={value}"]
    if kind == "output":
        return [*rng.choice(OUTPUTS), rng.choice(BAD_PATHS).format(tmp=tmp)]
    if kind == "plan":
        command = rng.choice([["export", "PLAN", "--to", rng.choice(["torchrun", "megatron", "torchtitan",
                                                                       "deepspeed"]), "--model", MODEL],
                              ["verify", MODEL, "--plan", "PLAN"],
                              ["estimate", MODEL, *HW, "--gpus", "2", "--plan", "PLAN"]])
        plan = rng.choice(BAD_PLANS)
        return [plan if a == "PLAN" else a for a in command]
    if kind == "model":
        model = rng.choice(BAD_MODELS)
        return rng.choice([["inspect", model], ["search", model, *HW, "--gpus", "2", "--global-batch", "4"]])
    return ["search", MODEL, "--hardware", rng.choice(BAD_HARDWARE), "--global-batch", "4"]


def test_bad_command_lines_are_one_line_exit_2_no_file(tmp_path, monkeypatch, capsys):
    from autopar.cli.main import main
    seed = int(os.environ.get("AUTOPAR_FUZZ_SEED") or random.SystemRandom().randrange(2 ** 32))
    with capsys.disabled():
        print(f"autopar CLI fuzz seed {seed} (replay: AUTOPAR_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    ckpt = str(tmp_path / "no-such-checkpoint")
    for i in range(CASES):
        argv = [ckpt if a == "CKPT" else a for a in _case(rng, str(work))]
        rc = main(argv)
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        where = f"seed {seed} case {i}: autopar {' '.join(repr(a)[:80] for a in argv)}"
        assert rc == 2, f"{where}: exit {rc}; {captured.err[-800:]}"
        assert len(lines) == 1 and lines[0].startswith("autopar") and ": error: " in lines[0], \
            f"{where}: {captured.err[-800:]}"
        assert "Traceback" not in captured.err and "internal error" not in captured.err, where
        assert captured.out == "", f"{where}: stdout {captured.out[:300]!r}"
        assert os.listdir(work) == [], f"{where}: left {os.listdir(work)}"


@pytest.mark.parametrize("argv", [["--version"]])
def test_version(capsys, argv):
    from autopar import __version__
    from autopar.cli.main import main
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == f"autopar {__version__}"
