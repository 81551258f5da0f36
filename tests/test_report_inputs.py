"""autopar report: reading plans files / estimate JSON, and one clear line for bad input."""
import json
import os

import pytest

from autopar.cli.main import main
from autopar.report.load import read_inputs
from costmodels.contracts.errors import PlanError

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "report")
G = [os.path.join(FIX, f"g{n}.json") for n in (256, 512, 1024)]


def run_cli(capsys, *argv):
    try:
        rc = main(["report", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_reads_plans_files_and_numbers_rows():
    recs = read_inputs(G)
    assert len(recs) == 10
    assert [r.id for r in recs] == list(range(1, 11))
    assert sorted({r.gpus for r in recs}) == [256, 512, 1024]
    assert all(r.model == "gpt3-175b" for r in recs)


def test_reads_single_estimate_and_array(tmp_path):
    one = json.load(open(os.path.join(FIX, "estimate_one.json")))
    (tmp_path / "one.json").write_text(json.dumps(one))
    (tmp_path / "arr.json").write_text(json.dumps([one, dict(one, micro_batch_size=2)]))
    assert len(read_inputs([str(tmp_path / "one.json")])) == 1
    assert len(read_inputs([str(tmp_path / "arr.json")])) == 2


@pytest.mark.parametrize("content, words", [
    ("hello, not json", "not valid JSON"),
    ("[]", "not a plans file"),
    ('{"a": 1}', "not a plans file"),
    ('"text"', "not a plans file"),
    ('{"version": 1, "plans": []}', "holds no plans"),
    ('{"plans": [{"dp": 2}]}', "does not say its model"),
    ('{"model": "gpt2-small", "hardware": "a100-80g-sxm", "gpus": 2, "global_batch": 8, "plans": [{"dp": 2}]}',
     "not an estimate"),
    ('{"model": "gpt2-small", "hardware": "h", "gpus": 2, "global_batch": 8, "plans": [{"dp": 0, '
     '"step_time_s": 1, "tokens_per_s": 1, "memory_bytes": {"total": 1}, "fits": true}]}', "'dp'=0"),
])
def test_bad_input_is_one_clear_line(tmp_path, capsys, content, words):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(PlanError, match=words if words[0] != "'" else None):
        read_inputs([str(p)])
    rc, out, err = run_cli(capsys, str(p), "-o", str(tmp_path / "r.html"))
    assert rc == 2 and out == ""
    assert err.startswith("autopar: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert words in err and "bad.json" in err
    assert not (tmp_path / "r.html").exists()


def test_binary_and_missing_files(tmp_path, capsys):
    b = tmp_path / "model.bin"
    b.write_bytes(bytes(range(256)) * 4)
    for path in (str(b), str(tmp_path / "nope.json"), str(tmp_path)):
        rc, out, err = run_cli(capsys, path, "--format", "md")
        assert rc == 2 and err.startswith("autopar: error: ") and err.count("\n") == 1


def test_mixed_models_need_allow_mixed(tmp_path, capsys):
    other = os.path.join(FIX, "other_model.json")
    rc, out, err = run_cli(capsys, G[0], other, "--format", "md")
    assert rc == 2 and "different models" in err and "--allow-mixed" in err and err.count("\n") == 1
    assert "gpt3-175b" in err and "llama3-70b" in err
    rc, out, err = run_cli(capsys, G[0], other, "--format", "md", "--allow-mixed")
    assert rc == 0 and "llama3-70b" in out and "gpt3-175b" in out


@pytest.mark.parametrize("args, words", [
    (["--diff", "1,99"], "no plan #99"),
    (["--diff", "1"], "--diff"),
    (["--diff", "a,b"], "--diff"),
    (["--detail", "x"], "--detail"),
    (["--format", "pdf"], "invalid choice"),
])
def test_bad_options(capsys, args, words):
    rc, out, err = run_cli(capsys, G[0], "--format", "md", *args) if "--format" not in args else \
        run_cli(capsys, G[0], *args)
    assert rc == 2 and words in err and err.count("\n") == 1
