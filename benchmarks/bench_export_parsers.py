"""Hand each export to its target's own configuration reader and print what the reader read back.

    python benchmarks/bench_export_parsers.py                              # torchtitan + DeepSpeed
    python benchmarks/bench_export_parsers.py --megatron-lm PATH           # + Megatron-LM's parser
    python benchmarks/bench_export_parsers.py --megatron-lm PATH --dump-megatron-flags > flags.txt

PATH is a checkout of Megatron-LM at release core_v0.16.1 (not on PyPI; its parser imports with
six, regex, pydantic and triton installed, no GPU). Its ``add_megatron_arguments`` parses the
exported flags and ``validate_args`` checks them for the plan's world size (the one GPU query
``validate_args`` makes, the device architecture, is answered "Hopper"); torchtitan 0.2.2's
``ConfigManager`` reads the job TOML and DeepSpeed's ``DeepSpeedConfig`` the JSON (both from the
test extra). Each line: the plan, then the reader's own values. A reader that is not installed is
reported and skipped. ``--dump-megatron-flags`` prints the flag list that
tests/data/megatron_lm_core_v0.16.1_flags.txt holds.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from export_plans import SPREAD, ctx_for  # noqa: E402

from autopar.export import export_plan, megatron, problems  # noqa: E402


def megatron_parser(path: str):
    sys.path.insert(0, path)
    arguments = importlib.import_module("megatron.training.arguments")
    arguments.get_device_arch_version = lambda: 9          # answer validate_args' GPU query
    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    return arguments, parser


def run_megatron(path: str) -> None:
    arguments, parser = megatron_parser(path)
    keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
            "data_parallel_size", "micro_batch_size", "global_batch_size", "sequence_parallel",
            "recompute_granularity", "recompute_method", "use_distributed_optimizer",
            "data_parallel_sharding_strategy", "decoder_first_pipeline_num_layers",
            "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout", "use_tp_pp_dp_mapping",
            "attention_backend")
    for plan in SPREAD:
        ctx = ctx_for(plan)
        if problems(plan, "megatron", ctx):
            continue
        argv = megatron.argv(plan, ctx) + ["--vocab-size", "4096", "--tokenizer-type", "NullTokenizer"]
        args = parser.parse_args(argv)
        args.rank, args.world_size = 0, plan.world_size
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1" if plan.zero < 2 else "8"   # as megatron.sh sets it
        try:
            with contextlib.redirect_stdout(io.StringIO()):            # it prints every argument
                arguments.validate_args(args, {})
            verdict = "validate_args OK"
        except (AssertionError, ValueError, RuntimeError) as e:
            verdict = f"validate_args REFUSED: {e}"
        read = {k: str(getattr(args, k, None)) for k in keys if getattr(args, k, None) not in (None, False)}
        print(f"megatron   {plan.label():55s} {verdict}\n           read: {read}")


def run_torchtitan() -> None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        found = version("torchtitan")
    except PackageNotFoundError:
        print("torchtitan: not installed (pip install -e .[test]); skipped")
        return
    spec = importlib.util.find_spec("torchtitan")     # its __init__ imports triton-only kernels
    package = types.ModuleType("torchtitan")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["torchtitan"] = package
    manager = importlib.import_module("torchtitan.config.manager")
    with tempfile.TemporaryDirectory() as folder:
        for plan in SPREAD:
            ctx = ctx_for(plan)
            if problems(plan, "torchtitan", ctx):
                continue
            path = Path(folder) / "job.toml"
            path.write_text(export_plan(plan, "torchtitan", ctx).text)
            job = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
            par = job.parallelism
            print(f"torchtitan {found} {plan.label():50s} replicate {par.data_parallel_replicate_degree} "
                  f"shard {par.data_parallel_shard_degree} ({par.fsdp_reshard_after_forward}) tp "
                  f"{par.tensor_parallel_degree} pp {par.pipeline_parallel_degree} "
                  f"{par.pipeline_parallel_schedule} mb {par.pipeline_parallel_microbatch_size} local "
                  f"{job.training.local_batch_size} global {job.training.global_batch_size} ac "
                  f"{job.activation_checkpoint.mode} chunks "
                  f"{[len(c) for c in par.module_fqns_per_model_part or []]}")


def run_deepspeed() -> None:
    try:
        config_module = importlib.import_module("deepspeed.runtime.config")
    except ImportError:
        print("deepspeed: not installed (pip install -e .[test]); skipped")
        return
    import deepspeed
    config_module.dist.get_rank = lambda: 0                  # no process group here
    for plan in SPREAD:
        ctx = ctx_for(plan)
        if problems(plan, "deepspeed", ctx):
            continue

        class MPU:
            def get_data_parallel_world_size(self, dp=plan.dp):
                return dp
        read = config_module.DeepSpeedConfig(json.loads(export_plan(plan, "deepspeed", ctx).text), mpu=MPU())
        print(f"deepspeed {deepspeed.__version__} {plan.label():50s} train_batch {read.train_batch_size} micro "
              f"{read.train_micro_batch_size_per_gpu} accumulation {read.gradient_accumulation_steps} zero "
              f"{read.zero_optimization_stage} overlap {read.zero_config.overlap_comm} bf16 "
              f"{read.bfloat16_config.enabled}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megatron-lm", default=None, metavar="PATH", help="a Megatron-LM checkout (core_v0.16.1)")
    ap.add_argument("--dump-megatron-flags", action="store_true", help="print its flag list and stop")
    args = ap.parse_args()
    if args.dump_megatron_flags:
        if not args.megatron_lm:
            ap.error("--dump-megatron-flags needs --megatron-lm PATH")
        _, parser = megatron_parser(args.megatron_lm)
        lines = set()
        for action in parser._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help"):
                    continue
                kind = "switch" if action.nargs == 0 else "value"
                choices = ("\tchoices=" + ",".join(str(c).split(".")[-1] for c in action.choices)
                           if action.choices else "")
                lines.add(f"{flag}\t{kind}{choices}")
        print("\n".join(sorted(lines)))
        return
    if args.megatron_lm:
        run_megatron(args.megatron_lm)
    else:
        print("megatron: no --megatron-lm checkout given; tests check the flags against "
              "tests/data/megatron_lm_core_v0.16.1_flags.txt")
    run_torchtitan()
    run_deepspeed()


if __name__ == "__main__":
    main()
