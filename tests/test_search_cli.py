"""`autopar search` / `autopar explain` end to end: table, JSON, plans file, nothing-fits."""
import json

import pytest

from autopar.cli.main import main
from costmodels.contracts.plans_file import load_plan, load_plans

TINY = "gpt:layers=4,hidden=64,heads=4,vocab=256,seq=32"


def test_search_json_and_plans_file(tmp_path, capsys):
    out = tmp_path / "plans.json"
    rc = main(["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "4", "--global-batch", "8",
               "--top", "3", "--json", "-o", str(out)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"plans", "optimal", "search_time_s", "model", "hardware", "gpus",
                         "global_batch", "seq", "objective", "version"}
    assert data["optimal"] is True and 1 <= len(data["plans"]) <= 3
    assert [p["rank"] for p in data["plans"]] == list(range(1, len(data["plans"]) + 1))
    assert out.read_text() == json.dumps(data, indent=2) + "\n"   # the file format, byte for byte
    plans = load_plans(str(out))                # what report / the runtime read
    assert load_plan(str(out)) == plans[0]
    assert plans[0].stages is not None and plans[0].world_size == 4
    for p in data["plans"]:
        assert {"step_time_s", "tokens_per_s", "mfu", "memory_bytes", "breakdown_s", "fits"} <= set(p)


def test_search_table_explain_and_fix(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = main(["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "4", "--global-batch", "8",
               "--fix", "tp=2,schedule=gpipe", "-o", str(out), "--explain"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "proved optimal" in text and "bottleneck" in text
    data = json.loads(out.read_text())
    assert all(p["tp"] == 2 for p in data["plans"])
    assert main(["explain", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Best plan" in text and "bottleneck" in text
    if len(data["plans"]) > 1:
        assert "#2" in text and "differs in" in text
    assert main(["explain", str(out), "--json"]) == 0
    ex = json.loads(capsys.readouterr().out)
    assert ex["best"]["bottleneck"] in ex["best"]["breakdown_s"]


@pytest.mark.parametrize("argv, needle", [
    (["--fix", "tpp=2"], "not a plan field"),
    (["--fix", "tp=3"], "does not divide"),
    (["--objective", "fewest_gpus"], "needs a target"),
])
def test_search_bad_input_is_one_line(argv, needle, capsys):
    rc = main(["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "4", "--global-batch", "8"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err


def test_explain_rejects_a_non_plans_file(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text('{"hello": 1}')
    assert main(["explain", str(p)]) == 2
    assert "not a plans file" in capsys.readouterr().err


@pytest.mark.parametrize("field, value, needle", [
    ("step_time_s", None, "'step_time_s'=None must be a non-negative number"),
    ("breakdown_s", {"compute": "fast"}, "'breakdown_s.compute'='fast' must be a number"),
    ("mfu", "high", "'mfu'='high' must be a number"),
])
def test_explain_names_the_file_and_field_of_a_bad_prediction(tmp_path, capsys, field, value, needle):
    out = tmp_path / "plans.json"
    assert main(["search", TINY, "--hardware", "a100-80g-sxm", "--gpus", "2", "--global-batch", "8",
                 "--top", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    data["plans"][-1][field] = value
    out.write_text(json.dumps(data))
    assert main(["explain", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(out) in err and "Traceback" not in err and "internal error" not in err
    assert len(err.strip().splitlines()) == 1


def test_gpt3_on_8_gpus_explains_why_nothing_fits(capsys):
    """The must-show: a search that cannot fit ends with the explanation, exit 2, no traceback.
    (``main`` in this process: the ``python -m autopar.cli.main`` entry's exit codes and one-line
    errors run as a subprocess in tests/test_cli_output.py and tests/test_trace_errors.py.)"""
    code = main(["search", "gpt3-175b", "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch", "1536"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert "no plan for gpt3-175b fits on 8" in err
    assert "smallest memory any plan reaches" in err and "GiB" in err
    assert "largest term is optimizer" in err           # 16 bytes/param of model state dominate
    assert "more GPUs" in err and "recompute" in err and "ZeRO-3" in err and "larger GPU" in err
    # 175e9 params x 16 bytes of model state over 32 GPUs is 81 GiB > 79: 64 is the first doubling
    # that fits (min_memory's budget once ran out while listing, and this said "none up to 512")
    assert "more GPUs: 64 fit" in err
