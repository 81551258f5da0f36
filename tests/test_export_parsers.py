"""Each export is accepted by its target's own configuration reader.

* torchtitan 0.2.2's ``ConfigManager`` reads the job TOML (``--job.config_file``);
* DeepSpeed 0.19.8's ``DeepSpeedConfig`` reads the JSON (with the data-parallel size given as
  Megatron's mpu gives it);
* Megatron-LM and Megatron-DeepSpeed are not on PyPI as installable trainers: every exported flag
  is checked against the flag lists of their argument parsers at a pinned release / commit
  (tests/data/*_flags.txt name where they come from); benchmarks/bench_export_parsers.py runs
  Megatron-LM's own parser on them when a checkout is given.

torchtitan and deepspeed come with ``pip install -e .[test]``; without them those tests skip.
torchtitan's package ``__init__`` imports its MoE kernels, which need triton (a GPU compiler); the
config reader does not, so the tests load ``torchtitan.config`` without running that ``__init__``.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from autopar.export import deepspeed, export_plan, megatron, problems, torchtitan
from autopar.export.stages import block_counts, torchtitan_default_counts
from costmodels.contracts.plan import Plan
from tests.export_plans import SPREAD, ctx_for

DATA = Path(__file__).parent / "data"


def read_flag_list(name: str) -> dict[str, tuple[str, set[str] | None]]:
    flags = {}
    for line in (DATA / name).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split("\t")
        choices = set(parts[2].removeprefix("choices=").split(",")) if len(parts) > 2 else None
        flags[parts[0]] = (parts[1], choices)
    return flags


def check_argv(argv: list[str], flags: dict) -> None:
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag in flags, f"{flag} is not a flag of the pinned parser"
        kind, choices = flags[flag]
        if kind == "switch":
            assert i + 1 == len(argv) or argv[i + 1].startswith("--"), f"{flag} takes no value"
            i += 1
        else:
            value = argv[i + 1]
            assert not value.startswith("--"), f"{flag} needs a value"
            assert choices is None or value in choices, f"{flag} {value} not in {sorted(choices)}"
            i += 2


LLAMA = "llama:layers=8,hidden=256,heads=8,kv_heads=2,ffn=768,vocab=4096,seq=256"


@pytest.mark.parametrize("plan", [p for p in SPREAD if not problems(p, "megatron", ctx_for(p))],
                         ids=lambda p: p.label())
def test_megatron_flags_are_megatron_lm_core_v0_16_1_flags(plan):
    flags = read_flag_list("megatron_lm_core_v0.16.1_flags.txt")
    check_argv(megatron.argv(plan, ctx_for(plan)), flags)
    check_argv(megatron.argv(plan, ctx_for(plan).with_(**_llama())), flags)


@pytest.mark.parametrize("plan", [p for p in SPREAD if not problems(p, "deepspeed", ctx_for(p))],
                         ids=lambda p: p.label())
def test_megatron_deepspeed_flags_are_its_parsers_flags(plan):
    flags = read_flag_list("megatron_deepspeed_4efb479_flags.txt")
    check_argv(deepspeed.argv(plan, ctx_for(plan)), flags)
    check_argv(deepspeed.argv(plan, ctx_for(plan).with_(**_llama())), flags)


def _llama():
    from autopar.export import context_for
    c = context_for(LLAMA)
    return {"model": LLAMA, "config": c.config, "n_rows": c.n_rows}


def test_flag_check_catches_a_wrong_flag():
    flags = read_flag_list("megatron_lm_core_v0.16.1_flags.txt")
    with pytest.raises(AssertionError):
        check_argv(["--tensor-parallel-size", "2"], flags)
    with pytest.raises(AssertionError):
        check_argv(["--recompute-granularity", "partial"], flags)


def torchtitan_package(monkeypatch):
    """torchtitan's installed package folder, registered as the ``torchtitan`` package without
    running its ``__init__`` (skip when torchtitan 0.2.x is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        found = version("torchtitan")
    except PackageNotFoundError:
        pytest.skip("torchtitan is not installed (pip install -e .[test])")
    if not found.startswith("0.2."):
        pytest.skip(f"torchtitan {found} reads no job TOML; the test extra pins torchtitan 0.2.2")
    spec = importlib.util.find_spec("torchtitan")
    package = types.ModuleType("torchtitan")
    package.__path__ = list(spec.submodule_search_locations)
    for name in [m for m in sys.modules if m == "torchtitan" or m.startswith("torchtitan.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchtitan", package)
    return Path(package.__path__[0])


def torchtitan_config_manager(monkeypatch):
    torchtitan_package(monkeypatch)
    return importlib.import_module("torchtitan.config.manager")


@pytest.mark.parametrize("plan", [p for p in SPREAD if not problems(p, "torchtitan", ctx_for(p))],
                         ids=lambda p: p.label())
def test_torchtitan_config_manager_reads_the_job_toml(plan, tmp_path, monkeypatch):
    manager = torchtitan_config_manager(monkeypatch)
    ctx = ctx_for(plan)
    path = tmp_path / "job.toml"
    path.write_text(export_plan(plan, "torchtitan", ctx).text)
    job = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    par = job.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (plan.tp, plan.pp)
    assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == plan.dp
    assert job.activation_checkpoint.mode == plan.recompute
    assert job.training.global_batch_size == 64 and job.training.seq_len == 256
    if plan.pp > 1:
        assert par.pipeline_parallel_microbatch_size == plan.micro_batch_size
        assert job.training.local_batch_size == 64 // plan.dp
        assert len(par.module_fqns_per_model_part) == plan.pp * plan.vpp
        assert par.module_fqns_per_model_part[0][0] == "tok_embeddings"
        assert par.module_fqns_per_model_part[-1][-2:] == ["norm", "output"]
    else:
        assert job.training.local_batch_size == plan.micro_batch_size


@pytest.mark.parametrize("layers,stages,first,last", [(8, 4, 1, 1), (30, 4, 1, 1), (32, 8, 2, 2),
                                                     (7, 3, 0, 1), (126, 16, 1, 1), (8, 2, 1, 0)])
def test_derived_torchtitan_split_matches_torchtitans_own(layers, stages, first, last, monkeypatch):
    # torchtitan's own function, taken alone from its installed module (whose imports need triton)
    source = (torchtitan_package(monkeypatch) / "distributed" / "pipeline_parallel.py").read_text()
    [fn] = [n for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef) and n.name == "generate_llm_fqn_per_model_part"]
    scope = {}
    exec(compile(ast.Module([fn], type_ignores=[]), "pipeline_parallel.py", "exec"), scope)
    theirs = scope["generate_llm_fqn_per_model_part"](stages, layers, first, last)
    mine = torchtitan_default_counts(layers, stages, first, last)
    assert mine == [sum(name.startswith("layers.") for name in chunk) for chunk in theirs]


@pytest.mark.parametrize("plan", [p for p in SPREAD if not problems(p, "deepspeed", ctx_for(p))],
                         ids=lambda p: p.label())
def test_deepspeed_config_class_reads_the_json(plan, monkeypatch):
    config_module = pytest.importorskip("deepspeed.runtime.config")
    import json

    class MegatronMPU:          # what Megatron-DeepSpeed hands DeepSpeed: the data-parallel size
        def get_data_parallel_world_size(self):
            return plan.dp
    monkeypatch.setattr(config_module.dist, "get_rank", lambda: 0)   # no process group in a test
    ctx = ctx_for(plan)
    exported = export_plan(plan, "deepspeed", ctx)
    read = config_module.DeepSpeedConfig(json.loads(exported.text), mpu=MegatronMPU())
    assert read.train_batch_size == 64
    assert read.train_micro_batch_size_per_gpu == plan.micro_batch_size
    assert read.gradient_accumulation_steps == plan.num_micro_batches(64)
    assert read.zero_optimization_stage == plan.zero
    assert read.zero_config.overlap_comm and read.bfloat16_config.enabled


def test_a_deepspeed_config_that_does_not_add_up_is_refused_by_deepspeed_too(monkeypatch):
    config_module = pytest.importorskip("deepspeed.runtime.config")

    class MPU:
        def get_data_parallel_world_size(self):
            return 3
    monkeypatch.setattr(config_module.dist, "get_rank", lambda: 0)
    plan = Plan(dp=2, stages=((0, 10),))
    with pytest.raises(AssertionError):
        config_module.DeepSpeedConfig(deepspeed.ds_config(plan, ctx_for(plan)), mpu=MPU())


def test_megatron_layout_counts_every_layer_once():
    plan = Plan(dp=2, pp=4, stages=((0, 4), (4, 5), (5, 7), (7, 10)))
    ctx = ctx_for(plan)
    args = megatron.argv(plan, ctx)
    layout = args[args.index("--pipeline-model-parallel-layout") + 1]
    assert layout == "Et*3|t|t*2|t*2L"
    assert block_counts(plan.stages, 10) == [3, 1, 2, 2]
    assert torchtitan.problems(plan, ctx)      # ZeRO-0 DDP beside pp: torchtitan cannot
