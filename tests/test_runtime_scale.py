"""Models larger than one process: build on meta, load weights into shards, distributed
checkpoints that resume under another plan (issue 12).

One world of 4 gloo processes is started once for the module (``world``) and runs every
multi-rank scenario in turn; each test then asserts one part of what the ranks returned:

* a gpt built on ``meta`` and applied under dp2·pp2·ZeRO-1 (seed 7) trains 3 AdamW steps with
  the losses of ``autopar.init_serial(model, seed=7)`` trained serially, and is saved;
* the checkpoint resumed under (a) the same plan gives steps 4–6 bit-identical to the
  uninterrupted run, under (b) tp2·pp2, (c) dp4·ZeRO-3, dp2·pp2·vpp2 interleaved with uneven split
  points and dp2·tp2·ZeRO-2 with sequence parallel within 1e-5 of the serial run;
* an 8-block gpt under pp2·tp2 and dp2·ZeRO-3·pp2: each rank's materialised parameter bytes are
  exactly its share, and never more than its share plus one row while it was built;
* a transformers Llama saved with ``save_pretrained`` (sharded safetensors) loads into a
  tp2·pp2 runner whose first loss equals the Hugging Face model's.

A second world of 2 ranks has one rank SIGKILLed in the middle of a save.
"""
from __future__ import annotations

import os
import signal
import sys

import pytest
import torch

from autopar.runtime.verify.serial import spawn

pytestmark = pytest.mark.slow

SPEC = "gpt:layers=4,hidden=32,heads=4,vocab=64,seq=16,dropout=0,tied=true"
BIG = "gpt:layers=8,hidden=64,heads=4,vocab=128,seq=16,dropout=0,tied=true"
SEED, GB, LR = 7, 8, 0.01
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
sys.path.insert(0, FIXTURES)
from train_loop import checkpoint_runner, serial_losses, train_steps  # noqa: E402  (tests/fixtures; in each rank too)
from world_prefetch import Job, result  # noqa: E402


def _llama_config():
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=16,
                                   tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    return cfg


def _train(runner, opt, source, start, n):
    return train_steps(runner, opt, source, start, n, GB)


def _serial(source, steps):
    return serial_losses(source, steps, GB, SEED, LR)


def _memory(plan):
    """(parameter bytes, peak while building, this rank's share, largest row) of BIG."""
    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.assemble.rows import model_rows
    from costmodels.contracts.plan import Plan
    source = load_model(BIG)
    runner = apply(source.build_meta(), Plan(**plan), seed=SEED, spec=BIG)
    model = source.build_meta()
    rows = model_rows(model)
    row_bytes = [sum(p.numel() * 4 for p in m.parameters()) for m in rows.modules]
    share, seen = 0, set()
    for s, stage in enumerate(runner._local.modules):
        for n, _ in stage.named_parameters(remove_duplicate=False):
            key = runner._local.names[s][n][0]
            if key in seen:
                continue
            seen.add(key)
            full = model.get_parameter(key).numel() * 4
            split = plan.get("tp", 1) if n in runner._local.shards[s] else 1
            share += full // split // (plan.get("dp", 1) if plan.get("zero", 0) == 3 else 1)
    stage_bytes = sum(row_bytes[i] for v in runner.virtual for i in range(*runner.stages_rows[v]))
    return dict(param_bytes=runner.parameter_bytes(), peak=runner.materialized["peak_param_bytes"],
                share=share, max_row=max(row_bytes), stage_bytes=stage_bytes)


def _hf_loss(weights_dir):
    from hf_llama_rows import LlamaRows

    from autopar.models.source import meta_parameters, token_loss
    from autopar.runtime.apply import apply
    from costmodels.contracts.plan import Plan
    with meta_parameters():
        model = LlamaRows(_llama_config())
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    runner = apply(model, Plan(tp=2, pp=2), loss_fn=token_loss, weights=weights_dir,
                   example_inputs=(ids[:1],))
    return runner.train_step((ids,), ids)


def _hf_model_loss(weights_dir):
    """The transformers model itself (not a stand-in), cut by the runtime's row cutter, its
    weights replaced by the save_pretrained ones (built with other random weights first, so a
    load that did nothing would show). Built whole: the meta build of hf: models is not there yet
    (constants the cut captures from a meta forward stay on meta)."""
    import transformers

    from autopar.models.source import token_loss
    from autopar.runtime.apply import apply
    from costmodels.contracts.plan import Plan
    torch.manual_seed(123)
    model = transformers.LlamaForCausalLM(_llama_config())
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    runner = apply(model, Plan(tp=2, pp=2), loss_fn=token_loss, weights=weights_dir,
                   example_inputs=(ids[:1],))
    return runner.train_step((ids,), ids)


def _world_rank(ckpt, hf_dir):
    import torch.distributed as dist

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    adist.ensure_initialized(4)
    source = load_model(SPEC)
    out = {"serial": _serial(source, 6) if dist.get_rank() == 0 else None}

    def run(plan, resume):
        return checkpoint_runner(source, SPEC, plan, SEED if not resume else 99, GB, LR, ckpt if resume else None)

    runner, opt, _ = run(dict(dp=2, pp=2, zero=1), False)
    first = _train(runner, opt, source, 0, 3)
    runner.save(ckpt, optimizer=opt, extra={"next_batch": 3})
    out["saved_state"] = runner.full_state_dict()
    out["uninterrupted"] = first + _train(runner, opt, source, 3, 3)
    for name, plan in (("same", dict(dp=2, pp=2, zero=1)), ("tp2pp2", dict(tp=2, pp=2)),
                       ("dp2pp2vpp2", dict(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b",
                                        stages=[[0, 1], [1, 3], [3, 5], [5, 6]])),
                       ("dp2tp2zero2sp", dict(dp=2, tp=2, zero=2, sequence_parallel=True)),
                       ("dp4zero3", dict(dp=4, zero=3))):
        runner, opt, extra = run(plan, True)
        out[name] = (extra, runner.step, _train(runner, opt, source, extra["next_batch"], 3))
    # an async save of the last runner (dp4·ZeRO-3): training goes on while it is written
    out["async_state"] = runner.full_state_dict()
    runner.save(ckpt + "_async", optimizer=opt, async_save=True)
    _train(runner, opt, source, 6, 1)
    runner.wait_for_save()
    # the checkpoint as weights= of a dp2·tp2 runner: only this rank's slices are read
    sliced = apply(source.build_meta(), Plan(dp=2, tp=2), spec=SPEC, weights=ckpt)
    out["weights_tp"] = (sliced.full_state_dict(), sliced.parameter_bytes(),
                         sliced.materialized["peak_param_bytes"])
    # a checkpoint of another model: one line on every rank, before anything is read
    other = load_model(SPEC.replace("hidden=32", "hidden=64"))
    wrong = apply(other.build_meta(), Plan(dp=4), seed=SEED, spec=other.spec)
    try:
        wrong.load(ckpt)
        out["wrong_model"] = None
    except Exception as e:  # noqa: BLE001  (the test asserts what it is)
        out["wrong_model"] = f"{type(e).__name__}: {e}"
    out["memory"] = {"pp2tp2": _memory(dict(pp=2, tp=2)),
                     "dp2zero3pp2": _memory(dict(dp=2, pp=2, zero=3))}
    out["hf_loss"] = _hf_loss(hf_dir)
    out["hf_model_loss"] = _hf_model_loss(hf_dir)
    return out


def scale_world():
    """The 4-rank world with its sharded HF checkpoint and its own checkpoint, in a folder the
    ``world`` fixture removes at the module's end: ``(ranks, hf_loss, ckpt, folder)``."""
    import tempfile

    import transformers

    from autopar.models.source import token_loss
    folder = tempfile.mkdtemp(prefix="autopar-scale-world-")
    hf_dir, ckpt = os.path.join(folder, "llama"), os.path.join(folder, "ckpt")
    os.makedirs(hf_dir), os.makedirs(ckpt)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(_llama_config())
    hf.save_pretrained(hf_dir, max_shard_size="20KB")   # sharded, with an index
    assert os.path.isfile(os.path.join(hf_dir, "model.safetensors.index.json"))
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_loss = float(token_loss(hf(input_ids=ids).logits, ids))
    ranks = spawn(_world_rank, 4, ckpt, hf_dir)
    return ranks, hf_loss, ckpt, folder


# run ahead of this module's turn, beside the single-process tests (tests/world_prefetch.py)
PREFETCH_WORLD = Job(scale_world)


@pytest.fixture(scope="module")
def world():
    import shutil
    ranks, hf_loss, ckpt, folder = result(__name__, PREFETCH_WORLD)
    yield ranks, hf_loss, ckpt
    shutil.rmtree(folder, ignore_errors=True)


def _rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def test_meta_build_trains_like_init_serial(world):
    ranks, *_ = world
    serial, par = ranks[0]["serial"], ranks[0]["uninterrupted"]
    assert _rel(par[:3], serial[:3]) < 1e-5, (par, serial)


def test_resume_same_plan_is_bit_identical(world):
    ranks, *_ = world
    extra, step, losses = ranks[0]["same"]
    assert extra == {"next_batch": 3} and step == 3
    assert losses == ranks[0]["uninterrupted"][3:]


@pytest.mark.parametrize("plan", ["tp2pp2", "dp2pp2vpp2", "dp2tp2zero2sp", "dp4zero3"])
def test_resume_under_another_plan_matches_serial(world, plan):
    ranks, *_ = world
    _, step, losses = ranks[0][plan]
    assert step == 3
    assert _rel(losses, ranks[0]["serial"][3:]) < 1e-5, (losses, ranks[0]["serial"][3:])


@pytest.mark.parametrize("plan", ["pp2tp2", "dp2zero3pp2"])
def test_each_rank_holds_its_share_plus_at_most_one_row(world, plan):
    ranks, *_ = world
    for r, out in enumerate(ranks):
        m = out["memory"][plan]
        assert m["param_bytes"] == m["share"], (r, m)
        assert m["share"] < 0.6 * m["stage_bytes"], (r, m)   # sharded: about half its stage
        assert m["peak"] <= m["share"] + m["max_row"], (r, m)


def test_hf_llama_loads_into_tp2_pp2(world):
    ranks, hf_loss, _ = world
    assert abs(ranks[0]["hf_loss"] - hf_loss) / hf_loss < 1e-5, (ranks[0]["hf_loss"], hf_loss)
    # the transformers LlamaForCausalLM itself under tp2·pp2, weights= the save_pretrained directory
    assert abs(ranks[0]["hf_model_loss"] - hf_loss) / hf_loss < 1e-5, (ranks[0]["hf_model_loss"], hf_loss)


# ---- the checkpoint out of the world: export, weights=, show, replan, wrong model ---------------
def test_export_streams_the_serial_state_dict(world, tmp_path):
    from safetensors.torch import load_file

    from autopar.runtime.checkpoints.export import export_checkpoint
    ranks, _, ckpt = world
    saved = ranks[0]["saved_state"]
    st = load_file(export_checkpoint(ckpt, str(tmp_path / "model.safetensors")))
    pt = torch.load(export_checkpoint(ckpt, str(tmp_path / "model.pt")))
    for out in (st, pt):
        assert out.keys() == saved.keys()
        assert all(torch.equal(out[k], v) for k, v in saved.items())


def test_async_save_and_wrong_model(world):
    from autopar.runtime.checkpoints.export import serial_state_dict
    ranks, _, ckpt = world
    saved, _ = serial_state_dict(ckpt + "_async")
    state = ranks[0]["async_state"]
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], v) for k, v in state.items())
    for out in ranks:
        assert out["wrong_model"].startswith("PlanError: checkpoint"), out["wrong_model"]
        assert "was saved from model" in out["wrong_model"]


def test_checkpoint_as_weights_of_a_tp_runner_reads_only_its_slices(world):
    ranks, *_ = world
    state, _, _ = ranks[0]["weights_tp"]
    saved = ranks[0]["saved_state"]
    assert state.keys() == saved.keys() and all(torch.equal(state[k], v) for k, v in saved.items())
    from autopar.models import load_model
    block = sum(p.numel() * 4 for p in load_model(SPEC).build_meta().blocks[0].parameters())
    for out in ranks:   # never a full block in flight (the tied LM head's shard is held twice
        _, kept, peak = out["weights_tp"]  # until it is re-tied: that is all above the share)
        assert kept <= peak < kept + block // 2, (kept, peak, block)


def test_checkpoint_as_weights_and_cli(world, tmp_path, capsys):
    from autopar.cli.main import main
    from autopar.models import load_model
    from autopar.runtime.assemble.materialize import init_serial
    from costmodels.contracts.errors import PlanError
    from costmodels.contracts.plans_file import load_plan
    ranks, _, ckpt = world
    model = init_serial(load_model(SPEC).build_meta(), weights=ckpt)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ranks[0]["saved_state"].items())
    assert main(["checkpoint", "show", ckpt]) == 0
    assert "dp2·tp1·pp2" in capsys.readouterr().out
    plans = str(tmp_path / "replan.json")
    assert main(["replan", ckpt, "--gpus", "2", "--hardware", "a100-80g-sxm", "-o", plans,
                 "--time-limit", "20"]) == 0
    assert load_plan(plans).world_size == 2
    other = load_model("gpt:layers=4,hidden=64,heads=4,vocab=64,seq=16,dropout=0").build_meta()
    with pytest.raises(PlanError, match="has shape"):
        init_serial(other, weights=ckpt)
    capsys.readouterr()
    assert main(["checkpoint", "show", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not an autopar checkpoint" in err and "Traceback" not in err


# ---- a rank SIGKILLed while saving ---------------------------------------------------------------
def _killed_rank(ckpt):
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    adist.ensure_initialized(2)
    source = load_model(SPEC)
    runner = apply(source.build_meta(), Plan(pp=2), seed=SEED, spec=SPEC, timeout_s=20)
    opt = torch.optim.SGD(runner.parameters(), lr=LR)
    _train(runner, opt, source, 0, 1)
    runner.save(ckpt, optimizer=opt, extra={"next_batch": 1})
    state = runner.full_state_dict()
    if state is not None:
        torch.save(state, ckpt + ".state_at_first_save.pt")
    _train(runner, opt, source, 1, 1)
    if dist.get_rank() == 1:   # dies in the middle of writing its files
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        FileSystemWriter.write_data = die
    runner.save(ckpt, optimizer=opt, extra={"next_batch": 2})


def test_sigkill_during_save_leaves_previous_checkpoint(tmp_path):
    from autopar.runtime.checkpoints.export import serial_state_dict
    ckpt = str(tmp_path / "ckpt")
    *ranks, failure = spawn(_killed_rank, 2, ckpt, partial=True)
    assert failure is not None and ranks == [None, None]     # rank 1 died, the world ended
    assert any(n.endswith(".tmp") for n in os.listdir(ckpt))  # ... in the middle of the save
    saved, extra = serial_state_dict(ckpt)
    assert extra == {"next_batch": 1}
    before = torch.load(ckpt + ".state_at_first_save.pt")
    assert saved.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(saved[k], v), k
