"""``autopar search --for megatron|torchtitan|deepspeed|torchrun``: the trainer the plans will be
exported to, as a synonym of ``--runtime`` with that trainer's runtime profile (the one
``autopar export --to`` reads), refused beside a ``--runtime`` that says otherwise."""
from __future__ import annotations

import json

MODEL = "gpt:layers=2,hidden=48,heads=6,vocab=256,seq=12,dropout=0"
ARGS = [MODEL, "--hardware", "a100-80g-sxm", "--gpus", "2", "--global-batch", "4", "--top", "2",
        "--time-limit", "20", "--json"]


def test_for_torchtitan_searches_under_its_runtime(capsys):
    from autopar.cli.main import main
    assert main(["search", *ARGS, "--for", "torchtitan"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["runtime"] for p in data["plans"]} == {"fsdp"}


def test_for_beside_another_runtime_is_refused(capsys):
    from autopar.cli.main import main
    assert main(["search", *ARGS, "--for", "megatron", "--runtime", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--for megatron searches under the megatron runtime" in err
