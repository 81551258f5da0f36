"""``autopar estimate`` and ``autopar.scoring.estimate_plans``: JSON in, JSON out, one-line errors."""
from __future__ import annotations

import json

import pytest

from autopar.cli.main import main

MODEL = "gpt:layers=4,hidden=256,heads=8,vocab=1000,seq=128"
ARGS = [MODEL, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch", "32"]
PLAN = {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 2, "recompute": "selective",
        "sequence_parallel": True, "attention": "math", "zero": 1}


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_estimate_json_one_plan(capsys):
    rc, out, err = _run(capsys, ["estimate", *ARGS, "--plan", json.dumps(PLAN), "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert isinstance(d, dict)
    for k in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "memory_bytes",
              "comm_bytes", "breakdown_s", "fits", "num_micro_batches", "stages_detail", "comm"):
        assert k in d
    assert d["model"] == MODEL and d["hardware"] == "a100-80g-sxm" and d["gpus"] == 8
    assert d["num_micro_batches"] == 32 // (2 * 2)
    assert d["dp"] == 2 and d["vpp"] == 1 and d["schedule"] == "1f1b"     # defaults filled in
    assert set(d["memory_bytes"]) == {"params", "grads", "optimizer", "gathered", "activations", "reserve",
                                      "total"}


def test_estimate_json_array_and_file(capsys, tmp_path):
    plans = [PLAN, {"dp": 8}, {"tp": 8, "attention": "flash"}]
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(plans))
    rc, out, err = _run(capsys, ["estimate", *ARGS, "--plan", str(path), "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert isinstance(d, list) and len(d) == 3
    assert [x["tp"] for x in d] == [2, 1, 8]
    # a plans file written by search: {"plans": [...]} is accepted too
    path.write_text(json.dumps({"version": 1, "plans": d}))
    rc, out, _ = _run(capsys, ["estimate", *ARGS, "--plan", str(path), "--json"])
    assert rc == 0 and [x["step_time_s"] for x in json.loads(out)] == [x["step_time_s"] for x in d]


def test_estimate_table_for_people(capsys):
    rc, out, err = _run(capsys, ["estimate", *ARGS, "--plan", json.dumps([PLAN, {"dp": 8}])])
    assert rc == 0, err
    assert "step time" in out and "MFU" in out and "fits" in out


@pytest.mark.parametrize("plan,msg", [
    ({"dp": 3}, "dp·cp·tp·pp = 3·1·1·1 = 3 but --gpus is 8"),
    ({"dp": 1, "tp": 8, "pp": 1, "micro_batch_size": 3}, "global batch 32 is not divisible"),
    ({"tp": 8, "heads": 3}, "unknown plan field(s) ['heads']"),
    ({"dp": 8, "recompute": "some"}, "plan field 'recompute'='some' is not one of"),
    ({"dp": 8, "zero": 4}, "plan field 'zero'=4 must be 0, 1, 2 or 3"),
])
def test_estimate_bad_plans_one_line_error(capsys, plan, msg):
    rc, out, err = _run(capsys, ["estimate", *ARGS, "--plan", json.dumps(plan)])
    assert rc == 2
    assert err.startswith("autopar: error: ") and msg in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_estimate_bad_inputs(capsys, tmp_path):
    rc, _, err = _run(capsys, ["estimate", *ARGS, "--plan", "{not json"])
    assert rc == 2 and "not valid JSON" in err
    rc, _, err = _run(capsys, ["estimate", *ARGS, "--plan", str(tmp_path / "missing.json")])
    assert rc == 2 and "does not exist" in err
    rc, _, err = _run(capsys, ["estimate", MODEL, "--hardware", "tpu-v9", "--gpus", "8",
                               "--global-batch", "32", "--plan", "{}"])
    assert rc == 2 and "unknown hardware profile 'tpu-v9'" in err
    bad = tmp_path / "bad.toml"
    bad.write_text('version = 1\nname = "x"\n[gpu]\n')
    rc, _, err = _run(capsys, ["estimate", MODEL, "--hardware", str(bad), "--gpus", "8",
                               "--global-batch", "32", "--plan", "{}"])
    assert rc == 2 and "field 'gpu.peak_bf16_flops_per_s'" in err


def test_python_api_matches_cli(capsys):
    from autopar.scoring import estimate_plans
    [d] = estimate_plans(MODEL, "a100-80g-sxm", 8, 32, PLAN)
    rc, out, _ = _run(capsys, ["estimate", *ARGS, "--plan", json.dumps(PLAN), "--json"])
    assert json.loads(out)["step_time_s"] == d["step_time_s"]


def test_seq_override(capsys):
    rc, out, err = _run(capsys, ["estimate", *ARGS, "--seq", "256", "--plan", '{"dp": 8}', "--json"])
    assert rc == 0, err
    assert json.loads(out)["seq"] == 256
