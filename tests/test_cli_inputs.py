"""Malformed invocations of the CLI end in one line naming the problem and the fix, before any
long work: absurd sizes, model settings that are zero, repeated or unknown, an unwritable or
misnamed -o, a crash inside the user's own model code, values too long to echo."""
from __future__ import annotations

import errno
import json
import math
import os

import pytest

import costmodels.contracts.files as files
from autopar.cli.main import main
from costmodels.contracts.checks import LIMITS

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "report")
G256 = os.path.join(FIX, "g256.json")
TINY = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=16"
SEARCH = ["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch", "8"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


class Called:
    """Stands in for a long-running function: records that it was (not) reached."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *a, **k):
        self.calls += 1
        raise AssertionError("the long work started")


# ------------------------------------------------------------------------------ absurd sizes
@pytest.mark.parametrize("argv,words", [
    (["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "99999999999999999999", "--global-batch", "8"],
     "--gpus: 99999999999999999999 is above autopar's limit of 262,144 (LIMITS['gpus']"),
    (["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch", "99999999999999999999"],
     "--global-batch: 99999999999999999999 is above autopar's limit"),
    (["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch", "8", "--time-limit", "inf"],
     "--time-limit: 'inf' must be a finite number"),
    (["estimate", TINY, "--hardware", "a100-80g-sxm", "--gpus", "0", "--global-batch", "8", "--plan", "{}"],
     "--gpus: 0 must be at least 1"),
    (["inspect", TINY, "--seq", str(LIMITS["seq"] + 1)], "--seq: 2097153 is above autopar's limit"),
    (["verify", TINY, "--plan", "{}", "--lr", "nan"], "--lr: 'nan' must be a finite number"),
    (["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "9" * 5000, "--global-batch", "8"],
     "is above autopar's limit"),
])
def test_absurd_flags_are_refused_before_any_work(capsys, monkeypatch, argv, words):
    import autopar.search
    import autopar.trace
    monkeypatch.setattr(autopar.search, "search", Called())
    monkeypatch.setattr(autopar.trace, "table_for", Called())
    code, out, err = run(capsys, *argv)
    line = one_line(err)
    assert code == 2 and words in line and len(line) < 400 and out == ""


@pytest.mark.parametrize("spec,words", [
    ("gpt:layers=1000000,hidden=64,heads=4,vocab=128,seq=16",
     "setting 'layers'=1000000 is above autopar's limit of 2,048 (LIMITS['layers']"),
    ("gpt:layers=2,hidden=64,heads=4,vocab=100000000000000000000,seq=16",
     "setting 'vocab'=100000000000000000000 is above autopar's limit"),
    (f"{TINY},ffn=0", "setting 'ffn=0' for family gpt must be at least 1 (leave 'ffn' out"),
    (f"{TINY},layers=3", "setting 'layers' is given twice"),
    (f"{TINY},layerz=2", "unknown setting 'layerz' for family gpt; did you mean 'layers'?"),
    (f"{TINY},dropout=nan", "setting 'dropout=nan' for family gpt must be a number at least 0 and below 1"),
])
def test_model_settings_zero_repeated_unknown_or_huge_are_refused(capsys, spec, words):
    code, _, err = run(capsys, "inspect", spec)
    assert code == 2 and words in one_line(err)


@pytest.mark.parametrize("spec,words", [
    ("llama:layers=2,hidden=64,heads=4,ffn=128,vocab=128,seq=16,kv_heads=0",
     "'kv_heads=0' for family llama must be at least 1"),
    ("vit:layers=2,hidden=64,heads=4,patch=0", "'patch=0' for family vit must be at least 1"),
    ("vit:layers=2,hidden=64,heads=4,image=16384,patch=1", "ViT tokens per image"),
])
def test_family_settings_that_used_to_default_or_crash(capsys, spec, words):
    code, _, err = run(capsys, "inspect", spec)
    assert code == 2 and words in one_line(err)


def test_a_huge_value_is_cut_short_in_the_message(capsys):
    code, _, err = run(capsys, "inspect", f"{TINY},{'k' * 100_000}=1")
    line = one_line(err)
    assert code == 2 and "(100002 characters)" in line and len(line) < 400
    code, _, err = run(capsys, "estimate", TINY, "--hardware", "a100-80g-sxm", "--gpus", "1",
                       "--global-batch", "8", "--plan", json.dumps({"recompute": "x" * 1_000_000}))
    line = one_line(err)
    assert code == 2 and "plan field 'recompute'='xxx" in line and len(line) < 400


def test_an_exception_in_the_users_build_names_their_file_and_line(capsys, tmp_path):
    src = tmp_path / "mymodel.py"
    src.write_text("import torch.nn as nn\n\n\ndef width():\n    return 64 // 0\n\n\n"
                   "def build(batch_size=1):\n    return nn.Linear(width(), 4), None\n")
    code, _, err = run(capsys, "inspect", f"{src}:build")
    line = one_line(err)
    assert code == 2 and "build() raised ZeroDivisionError" in line
    assert f"{src}:5 (in width)" in line


# --------------------------------------------------------------------------- -o before work
def deny_writes_in(monkeypatch, folder, code=errno.EACCES):
    """Make ``folder`` unwritable for costmodels.contracts.files (root ignores chmod), as a read-only or
    full disk would be."""
    real_open = os.open

    def guarded(path, flags, mode=0o777, **kw):
        if str(path).startswith(str(folder)) and flags & os.O_CREAT:
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, mode, **kw)
    monkeypatch.setattr(files.os, "open", guarded)


OUTPUT_COMMANDS = [   # (argv, the module and function of its long work)
    (SEARCH, ("autopar.search", "search")),
    (["estimate", TINY, "--hardware", "a100-80g-sxm", "--gpus", "1", "--global-batch", "8", "--plan", "{}"],
     ("autopar.scoring", "estimate_plans")),
    (["report", G256], ("autopar.report.core", "make_report")),
    (["profile", "--quick"], ("autopar.profile", "profile_machine")),
    (["validate", TINY, "--hardware", "cpu-2core", "--nproc", "1", "--global-batch", "2"],
     ("autopar.validate", "validate")),
]


def patch_long_work(monkeypatch, patch) -> Called:
    import importlib
    long_work = Called()
    monkeypatch.setattr(importlib.import_module(patch[0]), patch[1], long_work)
    return long_work


@pytest.mark.parametrize("command,patch", OUTPUT_COMMANDS)
def test_an_empty_output_name_is_refused_not_ignored(capsys, monkeypatch, command, patch):
    long_work = patch_long_work(monkeypatch, patch)
    code, out, err = run(capsys, *command, "-o", "")
    assert code == 2 and "names no file" in one_line(err) and long_work.calls == 0


@pytest.mark.parametrize("command,patch", OUTPUT_COMMANDS)
def test_an_unwritable_output_is_refused_before_the_long_work(capsys, monkeypatch, tmp_path, command, patch):
    long_work = patch_long_work(monkeypatch, patch)
    ro = tmp_path / "ro"
    ro.mkdir()
    deny_writes_in(monkeypatch, ro)
    name = "x.html" if command[0] == "report" else "x.toml" if command[0] == "profile" else "x.json"
    code, out, err = run(capsys, *command, "-o", str(ro / name))
    assert code == 2 and "permission denied" in one_line(err) and long_work.calls == 0
    deny_writes_in(monkeypatch, ro, errno.ENOSPC)
    code, out, err = run(capsys, *command, "-o", str(ro / name))
    assert code == 2 and "the disk is full" in one_line(err) and long_work.calls == 0
    assert os.listdir(ro) == []


@pytest.mark.parametrize("make,words", [
    (lambda d: "", "names no file"),
    (lambda d: str(d), "is a directory"),
    (lambda d: str(d / "missing" / "p.json"), "does not exist; create it first"),
])
def test_search_refuses_an_empty_directory_or_folderless_output(capsys, monkeypatch, tmp_path, make, words):
    import autopar.search
    monkeypatch.setattr(autopar.search, "search", Called())
    code, _, err = run(capsys, *SEARCH, "-o", make(tmp_path))
    assert code == 2 and words in one_line(err)
    assert not (tmp_path / "missing").exists()


# ------------------------------------------------------------------------- report's extension rule
@pytest.mark.parametrize("argv,words", [
    (["-o", "{d}/p.json"], "'.json' is not a report format; name the file .html, .htm, .md"),
    (["-o", "{d}/nonexistent/p.json"], "'.json' is not a report format"),
    (["-o", "{d}/p.html", "--format", "csv"], "the extension says html but --format is csv"),
    (["-o", "{d}/report"], "has no extension to pick the format from"),
    (["-o", ""], "names no file"),
    (["-o", "{d}/nonexistent/p.md"], "does not exist; create it first"),
])
def test_report_output_name_must_say_its_format(capsys, tmp_path, argv, words):
    code, out, err = run(capsys, "report", G256, *[a.format(d=tmp_path) for a in argv])
    assert code == 2 and words in one_line(err) and out == ""
    assert os.listdir(tmp_path) == []


def test_report_extension_picks_the_format_and_dash_is_stdout(capsys, tmp_path):
    assert run(capsys, "report", G256, "-o", str(tmp_path / "r.md"))[0] == 0
    assert (tmp_path / "r.md").read_text().startswith("# autopar report")
    assert run(capsys, "report", G256, "-o", str(tmp_path / "r"), "--format", "csv")[0] == 0
    assert (tmp_path / "r").read_text().splitlines()[0].startswith("id,")
    code, out, _ = run(capsys, "report", G256, "-o", "-", "--format", "md")
    assert code == 0 and out.startswith("# autopar report")


def test_report_diff_table_wraps_long_values():
    from autopar.report import make_report
    html = make_report([G256], fmt="html", detail=0)
    diff = html[html.index("id='diff'"):]
    assert "<table class='wrap'>" in diff[:3000]
    assert "table.wrap td{white-space:normal;overflow-wrap:anywhere" in html


# ----------------------------------------------------------------------- verify's comparison
def test_a_nan_or_infinite_loss_never_passes_verify():
    from autopar.runtime.verify.serial import compare
    assert compare([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert compare([1.0, math.nan], [1.0, 1.0]) == math.inf
    assert compare([1.0, 1.0], [math.inf, 1.0]) == math.inf
    assert compare([math.nan], [math.nan]) > 1e-5


@pytest.mark.parametrize("extra, lr", [([], 0.1), (["--optimizer", "adamw"], 1e-3),
                                       (["--optimizer", "adamw", "--lr", "0.05"], 0.05)])
def test_verify_picks_a_learning_rate_per_optimizer(capsys, monkeypatch, extra, lr):
    """AdamW at SGD's 0.1 made correct plans read as mismatches (its first, sign-like updates turn
    reduction-order rounding of near-zero gradients into lr-sized differences: a MoE dp4·ep2
    ZeRO-2 plan differed by 2.3e-5 at lr 0.1 and 5.7e-8 at 1e-3), so the default follows the
    optimizer; a given --lr wins. The run itself is replaced: this checks what reaches it."""
    import autopar.runtime.verify.serial as serial
    seen = {}

    def fake_verify(model, plan, **kw):
        seen.update(kw)
        return [1.0], [1.0], 2

    monkeypatch.setattr(serial, "verify", fake_verify)
    code, out, _ = run(capsys, "verify", TINY, "--plan", "{}", "--steps", "1", *extra)
    assert code == 0 and seen["lr"] == lr and f"{seen['optimizer']} lr {lr}," in out, out
