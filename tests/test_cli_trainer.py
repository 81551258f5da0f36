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


def test_one_owner_of_what_torchtitan_runs(capsys):
    """DDP beside tp / pp: the fsdp runtime profile (torchtitan's) refuses it, so the search never
    proposes it, estimate refuses it, and the torchtitan exporter refuses it by the same rule."""
    from autopar.cli.main import main
    from autopar.export import context_for, problems
    from costmodels.contracts.plan import Plan
    from costmodels.profiles.runtime import load_runtime
    from costmodels.profiles.runtime_rules import ddp_rule
    plan = Plan(dp=2, pp=2, micro_batch_size=1)
    assert ddp_rule(load_runtime("fsdp"), plan) and not ddp_rule(load_runtime("autopar"), plan)
    assert [p.field for p in problems(plan, "torchtitan", context_for(MODEL))] == ["zero"]
    assert main(["estimate", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "4", "--global-batch", "4",
                 "--runtime", "fsdp", "--plan", json.dumps(plan.to_dict())]) == 2
    assert "runs DDP (ZeRO-0 with dp > 1) only as the sole parallelism" in capsys.readouterr().err
    assert main(["search", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "4", "--global-batch", "8",
                 "--top", "20", "--time-limit", "20", "--json", "--for", "torchtitan",
                 "--fix", "zero=0,pp=2"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(p["dp"] == 1 for p in plans), plans   # DDP with pp: only with no dp to replicate
