"""Launch errors of autopar.apply: one clear line before any collective (no process group)."""
from __future__ import annotations

import pytest
import torch

import autopar
from autopar.models import load_model
from autopar.runtime.apply import _stage_ranges
from autopar.runtime.rows import model_rows
from costmodels.errors import PlanError
from costmodels.plan import Plan

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
    assert "world size 3" in str(e.value) and "dp·tp·pp = 4" in str(e.value)
    assert not torch.distributed.is_initialized()


def test_more_stages_than_rows_names_pp_and_vpp():
    rows = model_rows(load_model(SPEC).build("meta"))
    with pytest.raises(PlanError, match="'pp'·'vpp'"):
        _stage_ranges(Plan(pp=4, vpp=2, schedule="interleaved-1f1b"), rows, None, None)


def test_user_model_rows_cut_at_the_block_list():
    from test_runtime_parallel import NanoGPT
    rows = model_rows(NanoGPT(n_layer=3))
    assert rows.kinds == ["embedding", "block", "block", "block", "head"]
    assert rows.names[1:4] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    idx = torch.randint(0, 64, (2, 8))
    model = NanoGPT(n_layer=3)
    rows = model_rows(model)
    x = rows.modules[0](idx)
    for m in rows.modules[1:]:
        x = m(x)
    torch.testing.assert_close(x, model(idx))
