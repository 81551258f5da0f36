"""Heterogeneous clusters on the command line: search / estimate / report take --hardware pools and
--cluster files, bad input is one line, and a pooled plan runs unchanged under `autopar verify`."""
from __future__ import annotations

import json

import pytest

from autopar.cli.main import main

TINY = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=16"
POOLS = "a100-80g-sxm:8,h100-80g-sxm:8"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_search_then_estimate_and_report_a_pooled_plans_file(capsys, tmp_path):
    plans = tmp_path / "p.json"
    code, out, err = run(capsys, "search", TINY, "--hardware", POOLS, "--global-batch", "8", "--top", "2",
                         "-o", str(plans))
    assert code == 0, err
    data = json.loads(plans.read_text())
    assert data["hardware"] == POOLS and data["gpus"] == 16
    best = data["plans"][0]
    assert best["pools"] == [["a100-80g-sxm", 8], ["h100-80g-sxm", 8]] and len(best["stage_pools"]) == best["pp"]
    assert "plan 1 on a100-80g-sxm" in out and "plan 1 on h100-80g-sxm" in out   # why, per pool
    code, out, err = run(capsys, "estimate", TINY, "--hardware", POOLS, "--global-batch", "8",
                         "--plan", str(plans), "--json")
    assert code == 0, err
    again = json.loads(out)
    assert [d["step_time_s"] for d in again] == [p["step_time_s"] for p in data["plans"]]
    used = {u["profile"]: (u["used"], u["idle"]) for u in again[0]["cluster"]["pools"]}
    assert sum(used["a100-80g-sxm"]) == 8 and sum(used["h100-80g-sxm"]) == 8
    code, out, err = run(capsys, "explain", str(plans))
    assert code == 0, err
    assert "  pool a100-80g-sxm: " in out and "  pool h100-80g-sxm: " in out   # why, in explain too
    code, out, err = run(capsys, "report", str(plans), "-o", str(tmp_path / "r.md"))
    assert code == 0, err
    assert "Pools (heterogeneous cluster)" in (tmp_path / "r.md").read_text()


def test_cluster_file_on_the_command_line(capsys, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[[pool]]\nname = "old"\nprofile = "a100-80g-sxm"\nnodes = 1\n'
                 '[[pool]]\nname = "new"\nprofile = "h100-80g-sxm"\nnodes = 1\n'
                 '[[link]]\npools = ["old", "new"]\nbandwidth_bytes_per_s = 5e9\nlatency_s = 5e-5\n')
    code, out, err = run(capsys, "search", TINY, "--cluster", str(f), "--global-batch", "8", "--top", "1",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["hardware"] == "old:8,new:8"


@pytest.mark.parametrize("argv, words", [
    (["--hardware", "a100-80g-sxm:8,h100-80g-sxn:8"], "did you mean h100-80g-sxm"),
    (["--hardware", "a100-80g-sxm:12,h100-80g-sxm:8"], "not a whole number of 8-GPU nodes"),
    (["--hardware", POOLS, "--gpus", "32"], "add up to 16"),
    (["--hardware", POOLS, "--cluster", "c.toml"], "not both"),
    (["--gpus", "8"], "--hardware"),
    (["--hardware", POOLS, "--fix", "vpp=2"], "not searched on a cluster of pools"),
    (["--hardware", POOLS, "--fix", "stage_pools=0"], "is not a plan field"),
])
def test_bad_pool_flags_are_one_line(capsys, argv, words):
    code, out, err = run(capsys, "search", TINY, "--global-batch", "8", *argv)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], err


def test_bad_cluster_file_is_one_line(capsys, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[[pool]]\nprofile = "a100-80g-sxm"\nnodes = 1\ncolour = "red"\n')
    code, _, err = run(capsys, "estimate", TINY, "--cluster", str(f), "--global-batch", "8", "--plan", "{}")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "unknown key(s) ['colour']" in err


@pytest.mark.slow
def test_verify_runs_a_pooled_plan_unchanged(tmp_path, capsys):
    """One gloo run (``autopar verify``'s main in this process; it spawns the 2 ranks): the pools
    only place the ranks; the stages (uneven, from the plan) are what the runtime cuts, and the
    losses equal the serial model's."""
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"version": 1, "model": "x", "global_batch": 4, "plans": [
        {"pp": 2, "micro_batch_size": 1, "stages": [[0, 3], [3, 4]], "rank": 1,
         "pools": [["a100-80g-sxm", 8], ["h100-80g-sxm", 8]], "stage_pools": [1, 0]}]}))
    code, stdout, stderr = run(capsys, "verify", "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8,tied=true",
                               "--plan", str(plans), "--steps", "3", "--json")
    assert code == 0, stderr[-2000:]
    out = json.loads(stdout)
    assert out["ok"] and out["max_rel_diff"] <= 1e-5 and len(out["parallel"]) == 3
    assert out["plan"]["stage_pools"] == [1, 0] and out["plan"]["stages"] == [[0, 3], [3, 4]]
