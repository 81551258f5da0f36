"""A damaged checkpoint — garbage or empty ``.metadata``, a truncated or bit-flipped shard, a
``LATEST`` holding binary bytes — ends ``autopar checkpoint show`` / ``export``, ``autopar
replan`` and a resume (``runner.load``) in one line naming the damaged file and what to do: never
a traceback (torch's ``CheckpointException`` is a ``BaseException``), never a half-written file.
Also: ``checkpoint show --json`` of a checkpoint whose ``extra`` holds a tensor, and a stale
``.LATEST.<pid>`` (a save killed between its rename and LATEST's update) swept by the next save.

One process saves the checkpoint for the module, one resumes from every damaged copy."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "fixtures", "checkpoint_faults.py")
KINDS = ("garbage_metadata", "empty_metadata", "truncated_shard", "flipped_shard", "binary_latest")


def _python(*args):
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _damage(ckpt: str, kind: str) -> str:
    """The file of ``ckpt`` that ``kind`` damages."""
    step = os.path.join(ckpt, next(n for n in os.listdir(ckpt) if n.startswith("step-")))
    shard, meta = os.path.join(step, "__0_0.distcp"), os.path.join(step, ".metadata")
    if kind == "garbage_metadata":
        with open(meta, "wb") as f:
            f.write(bytes(range(256)) * 2)
        return meta
    if kind == "empty_metadata":
        open(meta, "wb").close()
        return meta
    if kind == "truncated_shard":
        os.truncate(shard, 1000)
        return shard
    if kind == "flipped_shard":   # bits of the saved 'autopar' entry (DCP keeps no checksum:
        from torch.distributed.checkpoint import FileSystemReader  # a flip inside a tensor's
        md = FileSystemReader(step).read_metadata()                  # values is not noticed)
        where = next(v for k, v in md.storage_data.items() if k.fqn == "autopar")
        data = bytearray(open(shard, "rb").read())
        for i in range(where.offset + 40, where.offset + where.length, 5):
            data[i] ^= 0xFF
        open(shard, "wb").write(bytes(data))
        return shard
    latest = os.path.join(ckpt, "LATEST")
    open(latest, "wb").write(b"\xff\xfe\x00\x81step")
    return latest


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    good = str(root / "good")
    swept = str(root / "swept")
    os.makedirs(swept)
    stale = os.path.join(swept, ".LATEST.999999")
    open(stale, "w").write("step-00000000-dead00\n")
    _python("make", good, swept)
    out = {"good": good, "stale": stale}
    for kind in KINDS:
        path = str(root / kind)
        shutil.copytree(good, path)
        out[kind] = (path, _damage(path, kind))
    return out


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error: "), captured.err
    assert "Traceback" not in captured.err and "internal error" not in captured.err
    return lines[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["show", "export", "replan"])
def test_cli_names_the_damaged_file(damaged, kind, command, tmp_path, capsys):
    from autopar.cli.main import main
    ckpt, bad_file = damaged[kind]
    out = str(tmp_path / ("model.safetensors" if command == "export" else "replan.json"))
    argv = {"show": ["checkpoint", "show", ckpt],
            "export": ["checkpoint", "export", ckpt, "-o", out],
            "replan": ["replan", ckpt, "--gpus", "1", "--hardware", "a100-80g-sxm", "-o", out,
                       "--time-limit", "5"]}[command]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert f"'{bad_file}' is damaged" in line, line
    assert "earlier checkpoint" in line or "write the name" in line, line
    assert os.listdir(tmp_path) == []   # nothing half-written (no .tmp beside the output)


def test_resume_names_the_damaged_file_alike_on_every_rank(damaged):
    """runner.load raises one PlanError naming the file, marked alike on every rank (so under a
    launcher rank 0 alone prints it); the good checkpoint loads."""
    paths = [damaged[k][0] for k in KINDS]
    got = json.loads(_python("load", damaged["good"], *paths).strip().splitlines()[-1])
    assert got[damaged["good"]] is None
    for kind in KINDS:
        ckpt, bad_file = damaged[kind]
        name, message, alike = got[ckpt]
        assert name == "PlanError" and f"'{bad_file}' is damaged" in message, (kind, message)
        assert alike and "\n" not in message, (kind, message)


def test_show_json_prints_a_tensor_in_extra(damaged, capsys):
    from autopar.cli.main import main
    assert main(["checkpoint", "show", damaged["good"], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["extra"]["next_batch"] == 1
    assert out["extra"]["data_rng"]["tensor"] == "uint8" and out["extra"]["data_rng"]["shape"]


def test_a_stale_latest_temporary_is_swept_by_the_next_save(damaged):
    assert not os.path.exists(damaged["stale"])
    assert os.path.isfile(os.path.join(os.path.dirname(damaged["stale"]), "LATEST"))


def test_cli_handler_catches_torchs_checkpoint_exception(monkeypatch, capsys):
    """What torch raises derives from BaseException: the CLI's one handler turns it into a line."""
    from torch.distributed.checkpoint.api import CheckpointException

    import autopar.cli.checkpoint as command
    from autopar.cli.main import main

    def raises(args):
        raise CheckpointException("load failed", {0: (EOFError("Ran out of input"), None)})

    monkeypatch.setattr(command, "run_show", raises)
    assert main(["checkpoint", "show", "anything"]) == 2
    line = _one_error_line(capsys)
    assert "EOFError: Ran out of input" in line and "earlier checkpoint" in line
