"""Launch errors of autopar.apply: one clear line before any collective (no process group)."""
from __future__ import annotations

import pytest
import torch

import autopar
from autopar.models import load_model
from autopar.runtime.apply import _stage_ranges
from autopar.runtime.assemble.rows import model_rows
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

SPEC = "gpt:layers=3,hidden=32,heads=4,vocab=64,seq=8"


@pytest.fixture
def no_torchrun(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert not torch.distributed.is_initialized()


def test_without_torchrun_env_says_how_to_launch(no_torchrun):
    model = load_model(SPEC).build("cpu")
    with pytest.raises(PlanError) as e:
        autopar.apply(model, Plan(dp=2))
    msg = str(e.value)
    assert "torchrun --nproc-per-node 2" in msg and "\n" not in msg
    assert not torch.distributed.is_initialized()


def test_world_size_mismatch_names_dp_tp_pp(no_torchrun, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    model = load_model(SPEC).build("cpu")
    with pytest.raises(PlanError) as e:
        autopar.apply(model, Plan(dp=2, tp=2))
    assert "world size 3" in str(e.value) and "dp·cp·tp·pp = 4" in str(e.value)
    assert not torch.distributed.is_initialized()


def test_more_stages_than_rows_names_pp_and_vpp():
    rows = model_rows(load_model(SPEC).build("meta"))
    with pytest.raises(PlanError, match="'pp'·'vpp'"):
        _stage_ranges(Plan(pp=4, vpp=2, schedule="interleaved-1f1b"), rows, None, None)


def test_user_model_rows_cut_at_the_block_list():
    from test_runtime_parallel import NanoGPT
    idx = torch.randint(0, 64, (2, 8))
    rows = model_rows(NanoGPT(n_layer=3), (idx,))
    assert rows.kinds == ["embedding", "block", "block", "block", "head"]
    assert rows.names[1:4] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    model = NanoGPT(n_layer=3)
    rows = model_rows(model, (idx,))
    x = rows.modules[0](idx)
    for m in rows.modules[1:]:
        x = m(*x) if isinstance(x, tuple) else m(x)
    torch.testing.assert_close(x, model(idx))


def test_verify_refuses_a_plan_before_spawning_any_rank(monkeypatch, capsys):
    """tp=2 does not divide 3 heads: ``autopar verify`` says so in one line and never spawns."""
    import autopar.runtime.verify.serial as verify_module
    from autopar.cli.main import main

    def no_spawn(*args, **kwargs):
        raise AssertionError("verify spawned ranks for a plan the runtime refuses")

    monkeypatch.setattr(verify_module, "spawn", no_spawn)
    rc = main(["verify", "gpt:layers=2,hidden=48,heads=3,vocab=64,seq=8", "--plan", '{"tp": 2}',
               "--nproc", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "plan field 'tp'=2 does not divide heads=3" in err


def test_apply_refuses_before_init_process_group(no_torchrun, monkeypatch):
    """Under torchrun's environment with the right world size, the plan-vs-model check still
    comes first: no process group is started (nobody listens on MASTER_PORT: starting one
    would fail with a store error instead)."""
    for k, v in dict(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    model = load_model(SPEC).build("cpu")       # 4 heads
    with pytest.raises(PlanError, match="'tp'=3 does not divide heads=4") as e:
        autopar.apply(model, Plan(tp=3), timeout_s=2)
    assert e.value.same_on_every_rank and not torch.distributed.is_initialized()


@pytest.mark.parametrize("rank", [0, 1])
def test_uncaught_errors_print_once_under_a_launcher(monkeypatch, capsys, rank):
    """Rank 0 prints a plan error every rank raises; the lowest surviving rank prints a lost
    peer; every other rank prints nothing."""
    import sys

    from autopar.runtime.faults import failures
    from autopar.runtime.faults.failures import PeerLostError, install_error_hook
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(failures, "QUIET_EXIT_DELAY_S", 0.0)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "3")
    install_error_hook()
    refused = PlanError("plan field 'tp'=3 does not divide heads=4")
    refused.same_on_every_rank = True
    lost = PeerLostError("rank 0 stopped answering during train_step")
    lost.reporting_rank = 1
    for err in (refused, lost):
        sys.excepthook(type(err), err, None)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"autopar: error: {refused if rank == 0 else lost}"]


def test_a_gloo_peer_error_becomes_one_line_naming_the_rank(monkeypatch):
    from autopar.runtime.faults import failures, liveness
    monkeypatch.setattr(liveness, "stopped_ranks", lambda ranks, me: [3])
    gloo = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Read "
                        "error [127.0.0.1]:33189: Connection reset by peer. This is typically caused")
    try:
        raise RuntimeError("\n  [Stage 1] failed to run backward:\n  args: ()") from gloo
    except RuntimeError as wrapped:
        with pytest.raises(failures.PeerLostError) as e, \
                failures.peer_failures("train_step", range(4), 0, 30.0):
            raise wrapped
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rank 3 stopped answering during train_step "
                                              "(pipeline stage 1 backward)"), msg
    assert "Connection reset by peer" in msg and "AUTOPAR_COLLECTIVE_TIMEOUT=30 s" in msg
    assert e.value.reporting_rank == 0
    with pytest.raises(ValueError), failures.peer_failures("train_step", range(4), 0, 30.0):
        raise ValueError("the user's own error, not a peer's")   # passes through unchanged
