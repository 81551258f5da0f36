"""Reading the configuration a user runs today: a published Megatron-LM launch script, torchtitan
and DeepSpeed configs, what cannot be modelled (one line each), and the CLI around it
(``autopar export``, ``estimate --from``, ``search --compare-with-current``)."""
from __future__ import annotations

import json

import pytest

from autopar.cli.main import main
from autopar.export import compare_estimates, context_for, import_config
from costmodels.contracts.errors import PlanError, SpecError

# The launch script of Megatron-LM's GPT-3 175B example, examples/gpt3/train_gpt3_175b_distributed.sh
# at release core_v0.16.1 (its variables, torchrun line and the flags autopar reads; the data,
# optimizer and logging arrays are left out).
MEGATRON_175B = """
GPUS_PER_NODE=8
NUM_NODES=1
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend auto # Can use (flash/fused/unfused/local)
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --rampup-batch-size 16 16 5859375
    --fp16
)
MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 8
	--pipeline-model-parallel-size 16
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \\
    ${GPT_MODEL_ARGS[@]} \\
    ${TRAINING_ARGS[@]} \\
    ${MODEL_PARALLEL_ARGS[@]}
"""
SMALL = "gpt:layers=8,hidden=256,heads=8,vocab=4096,seq=256"


def test_published_megatron_script_reads_as_its_plan():
    imported = import_config("megatron", MEGATRON_175B, context_for("gpt3-175b", gpus=1024))
    p = imported.plan
    assert (p.dp, p.tp, p.pp, p.vpp, p.micro_batch_size, p.zero) == (8, 8, 16, 1, 1, 0)
    assert (p.recompute, p.sequence_parallel, p.schedule, p.attention) == ("none", False, "1f1b", "flash")
    assert [b - a for a, b in p.stages] == [7] + [6] * 14 + [7]      # 6 layers a stage, E and L at the ends
    assert (imported.runtime, imported.global_batch, imported.seq) == ("megatron", 1536, 2048)


def test_published_script_on_its_own_one_node_is_refused_in_one_line():
    with pytest.raises(PlanError, match=r"^8 GPUs is not a multiple of tp·pp = 128 \(the megatron command line\)"):
        import_config("megatron", MEGATRON_175B, context_for("gpt3-175b"))


@pytest.mark.parametrize("text,error,match", [
    ("--tensor-model-parallel-size 2 --micro-batch-size 1 --context-parallel-size 2 --cp-comm-type a2a",
     PlanError, "--cp-comm-type a2a: autopar prices the p2p ring and allgather"),
    ("--micro-batch-size $MBS", PlanError, r"--micro-batch-size='\$MBS' must be a positive integer"),
    ("--tensor-model-parallel-size 2", PlanError, "no --micro-batch-size"),
    ("--micro-batch-size 1 --num-layers 12", SpecError, "--num-layers 12 but MODEL .* has layers=8"),
    ("--micro-batch-size 1 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*4|t*3mL'",
     PlanError, "no autopar row"),
    ("--micro-batch-size 1 --recompute-granularity full --recompute-method block --recompute-num-layers 2",
     PlanError, "use --recompute-method uniform --recompute-num-layers 1"),
])
def test_what_autopar_cannot_model_is_one_line(text, error, match):
    with pytest.raises(error, match=match) as e:
        import_config("megatron", text, context_for(SMALL, gpus=8))
    assert "\n" not in str(e.value)


def test_megatron_layout_and_virtual_stages_read_back():
    text = ("--micro-batch-size 2 --global-batch-size 64 --tensor-model-parallel-size 2 --sequence-parallel "
            "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'E|(t*2|)*2,t*4L' "
            "--recompute-activations --use-distributed-optimizer")
    p = import_config("megatron", text, context_for(SMALL, gpus=8)).plan
    assert (p.dp, p.tp, p.pp, p.vpp, p.schedule, p.zero, p.recompute) == (2, 2, 2, 2, "interleaved-1f1b", 1,
                                                                          "selective")
    assert [b - a for a, b in p.stages] == [1, 2, 2, 5]


TITAN = """
[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "1F1B"
pipeline_parallel_microbatch_size = 2
[training]
local_batch_size = 16
seq_len = 256
[activation_checkpoint]
mode = "full"
"""


def test_torchtitan_job_with_derived_split_and_leftover_dp():
    imported = import_config("torchtitan", TITAN, context_for(SMALL, gpus=16))
    p = imported.plan
    assert (p.dp, p.tp, p.pp, p.micro_batch_size, p.zero, p.recompute, p.sequence_parallel) == \
        (4, 2, 2, 2, 2, "full", True)                    # FSDP "default" with pp: no reshard = ZeRO-2
    assert [b - a for a, b in p.stages] == [5, 5]        # torchtitan: embedding and head count one layer
    assert (imported.runtime, imported.global_batch) == ("fsdp", 64)


@pytest.mark.parametrize("change,match", [
    (('mode = "full"', 'mode = "selective"'), "selective_ac_option = '2' checkpoints every n-th layer"),
    (("data_parallel_shard_degree = -1", "data_parallel_shard_degree = -1\ncontext_parallel_degree = 2\n"
      'context_parallel_rotate_method = "ring"'), "autopar prices 'allgather' and 'alltoall'"),
    (("local_batch_size = 16", "local_batch_size = 16\nglobal_batch_size = 128"), "several pipeline rounds"),
    (('"1F1B"', '"ZBVZeroBubble"'), "autopar models GPipe, 1F1B and Interleaved1F1B"),
])
def test_torchtitan_settings_autopar_cannot_model(change, match):
    with pytest.raises(PlanError, match=match):
        import_config("torchtitan", TITAN.replace(*change), context_for(SMALL, gpus=16))


def test_deepspeed_config_with_megatron_deepspeed_args():
    ds = json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                     "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 1}})
    args = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --checkpoint-activations"
    imported = import_config("deepspeed", ds, context_for(SMALL), megatron_args=args)
    p = imported.plan
    assert (p.dp, p.tp, p.pp, p.micro_batch_size, p.zero, p.recompute, p.attention) == \
        (4, 2, 2, 2, 1, "full", "math")
    assert imported.gpus == 16 and imported.runtime == "deepspeed"
    with pytest.raises(PlanError, match="means dp=4 but 8 GPUs"):
        import_config("deepspeed", ds, context_for(SMALL, gpus=8), megatron_args=args)


def test_compare_names_the_terms_and_fields_that_differ():
    def est(step, bubble, **plan):
        breakdown = dict.fromkeys(("compute", "recompute", "bubble", "dp_exposed", "tp_exposed",
                                   "pp_exposed", "zero_exposed"), 0.0)
        breakdown.update(compute=step - bubble, bubble=bubble)
        return {"dp": 1, "tp": 1, "pp": 1, **plan, "step_time_s": step, "breakdown_s": breakdown, "fits": True}
    c = compare_estimates(est(20.0, 4.0, pp=8, dp=2), est(16.0, 0.5, pp=2, dp=8))
    assert c["text"].startswith("yours: 20 s, best: 16 s, \u221220 %, because pipeline bubble 4 s -> 0.5 s")
    assert c["fields_changed"] == {"dp": [2, 8], "pp": [8, 2]}


def test_cli_export_estimate_from_and_compare(tmp_path, capsys):
    search_out = tmp_path / "plans.json"
    assert main(["search", SMALL, "--hardware", "h100-80g-sxm", "--gpus", "8", "--global-batch", "32",
                 "--fix", "pp=2", "--runtime", "megatron", "--time-limit", "30", "--json",
                 "-o", str(search_out)]) == 0
    capsys.readouterr()
    ds_path = tmp_path / "ds.json"
    assert main(["export", str(search_out), "--to", "megatron"]) == 0
    megatron_text = capsys.readouterr().out
    assert "--pipeline-model-parallel-size 2" in megatron_text
    code = main(["export", str(search_out), "--to", "deepspeed", "-o", str(ds_path)])
    out = capsys.readouterr()
    if code == 0:
        assert ds_path.exists() and (tmp_path / "ds.megatron-deepspeed.sh").exists()
    else:
        assert out.err.startswith("autopar: error: cannot export to deepspeed: plan field")
    (tmp_path / "mine.sh").write_text(megatron_text)
    assert main(["estimate", SMALL, "--hardware", "h100-80g-sxm", "--from", "megatron",
                 str(tmp_path / "mine.sh"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    best = json.loads(search_out.read_text())["plans"][0]
    assert result["runtime"] == "megatron" and result["step_time_s"] == pytest.approx(best["step_time_s"])
    assert main(["search", SMALL, "--hardware", "h100-80g-sxm", "--gpus", "8", "--global-batch", "32",
                 "--time-limit", "30", "--json", "--compare-with-current", "megatron",
                 "--tensor-model-parallel-size 8 --micro-batch-size 1 --recompute-granularity selective"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["current"]["tp"] == 8 and data["comparison"]["text"].startswith("yours: ")
    assert data["comparison"]["yours_s"] >= data["plans"][0]["step_time_s"]


@pytest.mark.parametrize("argv,match", [
    (["estimate", SMALL, "--hardware", "h100-80g-sxm", "--gpus", "8", "--global-batch", "8"],
     "give either --plan PLAN or --from TARGET CONFIG"),
    (["estimate", SMALL, "--hardware", "h100-80g-sxm", "--from", "megatron", "--micro-batch-size 1"],
     "does not say how many GPUs it runs on: give --gpus N"),
    (["estimate", SMALL, "--hardware", "h100-80g-sxm", "--gpus", "8", "--from", "nemo", "x"],
     "unknown configuration kind 'nemo'"),
    (["export", '{"dp": 2, "zero": 1}', "--to", "torchtitan", "--model", SMALL, "--global-batch", "8"],
     "cannot export to torchtitan: plan field 'zero'=1"),
    (["export", '{"dp": 2}', "--to", "megatron"], "does not say the model: give --model MODEL"),
])
def test_cli_bad_input_is_one_line(argv, match, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: error: ") and match in err and err.count("\n") == 1
