"""Inputs that were accepted or crashed, each now one line and exit 2: ``hf:`` configs above the
size limits, undecodable bytes in a configuration or runtime file, a pool that is not whole
nodes, ``fewest_gpus`` with both targets (refused before the model is traced)."""
from __future__ import annotations

import json

import pytest

MODEL = "gpt:layers=2,hidden=48,heads=6,vocab=256,seq=12,dropout=0"


def _one_line(capsys, argv, needle):
    from autopar.cli.main import main
    rc = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("field, value, needle", [
    ("n_layer", 100_000, "num_hidden_layers=100,000 is above autopar's limit of 2,048"),
    ("n_embd", 1_048_576, "hidden_size=1,048,576 is above autopar's limit of 131,072"),
    ("n_head", 0, "num_attention_heads=0 must be a positive integer"),
])
def test_hf_configs_are_held_to_the_limits(tmp_path, capsys, field, value, needle):
    config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
              "n_positions": 32, field: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    _one_line(capsys, ["inspect", f"hf:{path}"], needle)


def test_hf_config_within_limits_still_loads():
    from autopar.models import load_model
    source = load_model("hf:tests/fixtures/tiny_llama_config.json")
    assert source.seq == 32


@pytest.mark.parametrize("argv_of", [
    lambda f: ["estimate", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "2", "--from", "deepspeed", f],
    lambda f: ["search", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "2", "--global-batch", "8",
               "--compare-with-current", "torchtitan", f],
])
def test_undecodable_configuration_files(tmp_path, capsys, argv_of):
    bad = tmp_path / "config.json"
    bad.write_bytes(b'{"train_batch_size": 8, \xff\xfe}')
    _one_line(capsys, argv_of(str(bad)), "is not UTF-8 text (byte 24 is 0xff)")


def test_undecodable_runtime_profile(tmp_path, capsys):
    bad = tmp_path / "rt.toml"
    bad.write_bytes(b"\xff\xfe")
    _one_line(capsys, ["search", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "2",
                       "--global-batch", "8", "--runtime", str(bad)], "is not UTF-8 text")


def test_a_pool_of_part_of_a_node_is_refused(capsys):
    _one_line(capsys, ["search", MODEL, "--hardware", "a100-80g-sxm:7", "--global-batch", "8"],
              "7 GPUs is not a whole number of 8-GPU nodes")


def test_fewest_gpus_with_both_targets_is_refused_before_tracing(capsys, monkeypatch):
    import autopar.trace

    def no_trace(*args, **kwargs):
        raise AssertionError("traced before the request was checked")

    monkeypatch.setattr(autopar.trace, "table_for", no_trace)
    _one_line(capsys, ["search", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch",
                       "8", "--objective", "fewest_gpus", "--target-step-time", "1",
                       "--target-tokens-per-s", "100"], "give one target")
    _one_line(capsys, ["search", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch",
                       "8", "--objective", "fewest_gpus"], "needs a target")


@pytest.mark.parametrize("argv, needle", [
    (["--model", "gpt3-175b"], "is a plans file for gpt:layers=2"),
    (["--gpus", "8"], "dp·cp·tp·pp = 2·1·1·1 = 2 but --gpus is 8"),
    (["--global-batch", "3"], "global batch 3 is not divisible by dp·micro_batch_size = 2·1"),
])
def test_estimate_checks_a_plans_file_before_tracing(tmp_path, capsys, monkeypatch, argv, needle):
    """A plans file for another model, a GPU count or batch the plan cannot use: refused before
    the model is traced (gpt3-175b's trace took 20-30 s before the refusal)."""
    import autopar.trace
    monkeypatch.setattr(autopar.trace, "table_for", lambda *a, **k: pytest.fail("traced first"))
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"version": 1, "model": MODEL, "plans": [{"dp": 2}]}))
    given = dict(zip(["--model", "--gpus", "--global-batch"], [MODEL, "2", "4"]))
    given.update(dict(zip(argv[::2], argv[1::2])))
    _one_line(capsys, ["estimate", given.pop("--model"), "--hardware", "a100-80g-sxm", "--plan", str(plans),
                       *[x for kv in given.items() for x in kv]], needle)
