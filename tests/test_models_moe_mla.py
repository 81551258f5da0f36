"""The ``moe`` family's Multi-head Latent Attention option (``kv_lora_rank=…``,
autopar/models/mla.py): its parameters and forward FLOPs are what the cost model's analytic MLA
(costmodels/calibration/mla.py) counts, a bad width is one line, and autopar's runtime refuses it
under tensor parallelism before launch (it runs with dp / ep: ``autopar verify`` ep2 equal to
serial, run by hand, README)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autopar.export.megatron import moe_model_args
from autopar.models import load_model
from autopar.models.mla import MLAttention
from autopar.runtime.assemble.prelaunch import check_before_launch
from costmodels.calibration.mla import MLAShape, mla_fwd_flops, mla_params
from costmodels.contracts.errors import PlanError, SpecError
from costmodels.contracts.plan import Plan

BASE = "moe:layers=2,hidden=64,heads=4,ffn=128,vocab=256,seq=32,experts=4,top_k=2,expert_ffn=32"
MLA = ",kv_lora_rank=16,q_lora_rank=24,qk_nope_head_dim=8,qk_rope_head_dim=4,v_head_dim=8"


@pytest.fixture(scope="module")
def source():
    return load_model(BASE + MLA)


@pytest.mark.parametrize("q_lora", [24, 0])
def test_mla_module_matches_the_cost_models_count(q_lora):
    spec = BASE + MLA.replace("q_lora_rank=24", f"q_lora_rank={q_lora}") if q_lora else \
        BASE + MLA.replace(",q_lora_rank=24", "")
    cfg = load_model(spec).config
    attn = MLAttention(cfg, "flash")
    shape = MLAShape(q_lora or None, 16, 8, 4, 8)
    assert sum(p.numel() for p in attn.parameters()) == mla_params(64, 4, shape)
    x = torch.randn(2, 32, 64)
    with FlopCounterMode(display=False) as fc:
        y = attn(x)
    assert y.shape == x.shape
    assert fc.get_total_flops() == mla_fwd_flops(2, 32, 64, 4, shape)


def test_bad_mla_widths_are_one_line():
    with pytest.raises(SpecError, match="needs qk_nope_head_dim, qk_rope_head_dim, v_head_dim"):
        load_model(BASE + ",kv_lora_rank=16")
    with pytest.raises(SpecError, match="without kv_lora_rank"):
        load_model(BASE + ",v_head_dim=8")
    with pytest.raises(SpecError, match="must be even"):
        load_model(BASE + MLA.replace("qk_rope_head_dim=4", "qk_rope_head_dim=3"))


def test_runtime_refuses_mla_under_tp_and_runs_it_with_ep(source):
    model = source.build_meta() if hasattr(source, "build_meta") else source.build()
    x = source.example_inputs() if callable(source.example_inputs) else source.example_inputs
    with pytest.raises(PlanError, match="Multi-head Latent Attention") as e:
        check_before_launch(model, Plan(dp=2, tp=2), spec=source.spec, example_inputs=x, probe=False,
                            on_this_machine=False)
    assert "\n" not in str(e.value) and "tp=1" in str(e.value)
    check_before_launch(model, Plan(dp=2, ep=2), spec=source.spec, example_inputs=x, probe=False,
                        on_this_machine=False)


def test_megatron_export_writes_mla(source):
    args = moe_model_args(source.config)
    flags = dict(a for a in args if isinstance(a, tuple))
    assert "--multi-latent-attention" in args and "--group-query-attention" not in args
    assert (flags["--q-lora-rank"], flags["--kv-lora-rank"], flags["--qk-head-dim"],
            flags["--qk-pos-emb-head-dim"], flags["--v-head-dim"]) == (24, 16, 8, 4, 8)
