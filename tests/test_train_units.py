"""``autopar train``'s parts, in one process: the data order (any dp split reads the same samples
per step; a resume continues it), the learning-rate schedule, the 1-based ``--index``, the CUDA
defaults' environment, the step without host syncs, and the torchrun export's launch line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from autopar.runtime.training.data import RandomTokens, TokenFile, local_batch, token_dtype
from autopar.runtime.training.loop import TrainConfig, check_config, choose_plan
from autopar.runtime.training.schedule import lr_factor
from costmodels.contracts.errors import PlanError, SpecError

SPEC = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8,dropout=0"


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 64, 1000).astype(np.uint16).tofile(path)
    return str(path)


def test_every_dp_split_reads_the_steps_samples_and_resume_continues(tokens):
    data = TokenFile(tokens, seq=8, vocab=64)
    whole = data.batch(16, 8)   # step 3 of a global batch of 8 starts at sample 16
    for dp in (1, 2, 4):
        parts = [local_batch(data, 16, 8, d, dp) for d in range(dp)]
        assert torch.equal(torch.cat([p[0][0] for p in parts]), whole[0][0])
        assert torch.equal(torch.cat([p[1] for p in parts]), whole[1])
    (x,), y = whole
    assert torch.equal(x[0][1:], y[0][:-1])                     # targets: the next tokens
    raw = torch.from_numpy(np.fromfile(tokens, dtype=np.uint16).astype(np.int64))
    assert torch.equal(x[0], raw[16 * 8:17 * 8])                 # sample i starts at token i·seq
    assert not torch.equal(data.batch(24, 8)[0][0], x)        # the next step: new samples
    r = RandomTokens(__import__("autopar.models", fromlist=["load_model"]).load_model(SPEC))
    assert torch.equal(torch.cat([r.batch(4, 2)[0][0], r.batch(6, 2)[0][0]]), r.batch(4, 4)[0][0])


def test_token_file_refusals(tmp_path, tokens):
    with pytest.raises(SpecError, match="no such file"):
        TokenFile(str(tmp_path / "missing.bin"), seq=8)
    with pytest.raises(SpecError, match=">= the model's vocabulary 32"):
        TokenFile(tokens, seq=8, vocab=32)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 1001)
    with pytest.raises(SpecError, match="whole number of uint16"):
        TokenFile(str(odd), seq=8)
    assert token_dtype("x.bin", None, 50257) == np.uint16 and token_dtype("x.bin", None, 128256) == np.uint32


def test_warmup_then_cosine_to_a_tenth():
    assert [lr_factor(s, 4, 20) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 4, 20) == 1.0 and lr_factor(20, 4, 20) == pytest.approx(0.1)
    assert lr_factor(12, 4, 20) == pytest.approx(0.55)           # half way down the cosine


def test_index_counts_from_one_and_flags_are_checked(tmp_path):
    plans = tmp_path / "plans.json"
    plans.write_text('[{"dp": 2}, {"pp": 2}]')
    cfg = TrainConfig(model=SPEC, plan=str(plans), global_batch=8, index=2)
    assert choose_plan(cfg)[0].pp == 2
    with pytest.raises(PlanError, match=r"numbered 1..2"):
        choose_plan(TrainConfig(model=SPEC, plan=str(plans), index=0))
    with pytest.raises(PlanError, match="--save-every needs --save"):
        check_config(TrainConfig(model=SPEC, plan="{}", save_every=5))


def test_cuda_defaults_yield_to_the_users_settings():
    from autopar.runtime.step.gpu_defaults import ALLOC_CONF, apply_on, env_defaults
    got = env_defaults({})
    assert got["PYTORCH_CUDA_ALLOC_CONF"] == ALLOC_CONF and got["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert got["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].endswith("_rank_")   # torch appends the rank
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env_defaults({"PYTORCH_CUDA_ALLOC_CONF": "backend:native"})
    assert apply_on(torch.device("cpu")) == {}


def test_a_step_without_sync_never_reads_the_device(monkeypatch):
    """train_step(sync=False) and the clipping: no .item(), float() or .cpu() of a tensor (each a
    host-device sync on a GPU); the float comes only when asked."""
    import autopar
    from autopar.models import load_model
    source = load_model(SPEC)
    runner = autopar.apply(source.build("cpu", seed=0), {"micro_batch_size": 2}, loss_fn=source.loss)
    (x,), y = source.make_batch(8, seed=0)
    eager = runner.train_step(x, y)
    assert isinstance(eager, float)

    def synced(*a, **k):
        raise AssertionError("host sync in the step")
    for name in ("item", "__float__", "cpu", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, synced)
    loss = runner.train_step(x, y, sync=False)
    norm = runner.clip_grad_norm_(0.5)
    monkeypatch.undo()
    assert loss.dim() == 0 and loss.dtype == torch.float64 and float(loss) == pytest.approx(eager, rel=1e-6)
    assert float(norm) > 0


def test_torchrun_export_launches_the_packaged_loop():
    from autopar.export import torchrun
    from autopar.export.context import TrainingContext
    from costmodels.contracts.plan import Plan
    ctx = TrainingContext(model=SPEC, global_batch=8, seq=8)
    text = torchrun.export(Plan(dp=2, pp=2), ctx).files["torchrun.sh"]
    line = text.splitlines()[-1]
    assert line.strip().startswith(f"-m autopar.train {SPEC} --seq 8 --plan '{{")
    assert '--global-batch 8 --data "${DATA:-random}" --steps "${STEPS:-1000}"' in line
    back = torchrun.parse(text, ctx)
    assert back.plan.dp == 2 and back.plan.pp == 2 and back.global_batch == 8


def test_bad_input_is_one_line(tmp_path, capsys):
    from autopar.cli.main import main
    code = main(["train", SPEC, "--plan", '{"dp": 1}', "--global-batch", "4", "--steps", "2",
                 "--data", str(tmp_path / "none.bin")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("autopar: error: --data ")
    assert "no such file" in err
