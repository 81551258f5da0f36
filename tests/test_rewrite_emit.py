"""Single-process checks of the rewrite: graph structure, recompute, errors, and ``autopar apply
--emit`` (FakeGroup: no process group needed)."""
from __future__ import annotations

import os

import pytest
import torch

from autopar.models import load_model
from autopar.rewrite import FakeGroup, gather_row_state_dict, rewrite_row
from costmodels.contracts.errors import PlanError

GPT = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8"
LLAMA = "llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8"
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "nanogpt.py")


def _rw(mod, kind="block", tp=2, rank=0, sp=False, rc="none", x=None):
    return rewrite_row(mod, kind=kind, tp_rank=rank, tp_size=tp, tp_group=FakeGroup(rank, tp),
                       sequence_parallel=sp, recompute=rc, example_input=x)


def test_gpt_block_shards_fused_qkv_and_rewrites_sizes():
    block = load_model(GPT).build("cpu").blocks[0]
    gm = _rw(block, rank=1)
    code = gm.code
    assert "self.attn.copy_to_tp(" in code and "self.attn.c_proj_all_reduce(" in code
    assert "self.mlp.c_proj_all_reduce(" in code
    assert ".view(getitem, getitem_1, 2, floordiv)" in code          # n_head 4 -> 2
    assert "getitem_2 // 2" in code                                    # split size C -> C/2
    assert gm.attn.c_attn.weight.shape == (48, 32)
    # rank 1 holds the second half of each of q, k, v
    w = block.attn.c_attn.weight
    want = torch.cat([w[16:32], w[48:64], w[80:96]])
    assert torch.equal(gm.attn.c_attn.weight, want)
    assert gm.attn.c_proj.weight.shape == (32, 16)
    assert gm.autopar_shards["attn.c_attn.weight"].segments == (32, 32, 32)
    assert gm.mlp.c_fc.weight.shape == (64, 32)


def test_llama_block_gqa_heads():
    gm = _rw(load_model(LLAMA).build("cpu").blocks[0])
    code = gm.code
    assert "view(getitem, getitem_1, 2, 8)" in code and "view(getitem, getitem_1, 1, 8)" in code
    assert gm.attn.wk.weight.shape == (8, 32) and gm.attn.wq.weight.shape == (16, 32)
    assert gm.mlp.w1.weight.shape == (32, 32) and gm.mlp.w2.weight.shape == (32, 32)


def test_recompute_selective_and_full():
    block = load_model(GPT).build("cpu").blocks[0]
    sel = _rw(block, rc="selective")
    assert "torch.utils.checkpoint.checkpoint(attention_core" in sel.code
    assert "softmax" not in sel.code and "softmax" in sel.attention_core.code
    full = _rw(block, rc="full", sp=True)
    assert "torch.utils.checkpoint.checkpoint(row, x, use_reentrant = False)" in full.code
    assert "row.attn.c_attn.weight" in full.autopar_shards
    x = torch.randn(2, 4, 32)   # tp=1 keeps numerics: compare against the serial block
    for rc in ("none", "selective", "full"):
        gm = _rw(block, tp=1, rc=rc)
        torch.testing.assert_close(gm(x), block(x), rtol=1e-6, atol=1e-6)


def test_embedding_and_head_vocab_parallel_or_replicated():
    m = load_model(GPT).build("cpu")
    emb = _rw(m.embedding, kind="embedding", rank=1)
    assert emb.wte.weight.shape == (32, 32) and "wte_all_reduce" in emb.code
    head = _rw(m.head, kind="head", sp=True)
    assert "sp_gather_input" in head.code and "lm_head_gather" in head.code
    odd = load_model("gpt:layers=1,hidden=32,heads=4,vocab=63,seq=8").build("cpu")
    e2 = _rw(odd.embedding, kind="embedding")
    assert e2.wte.weight.shape == (63, 32) and "all_reduce" not in e2.code


def test_state_dict_roundtrip_tp1():
    block = load_model(LLAMA).build("cpu").blocks[0]
    gm = _rw(block, tp=1, rc="full")
    full = gather_row_state_dict(gm, FakeGroup(0, 1))
    for k, v in block.state_dict().items():
        assert torch.equal(full[k], v)


@pytest.mark.parametrize("spec,tp,field", [
    ("gpt:layers=1,hidden=48,heads=4,vocab=64,seq=8", 3, "heads=4"),
    ("llama:layers=1,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8", 4, "kv_heads=2"),
    ("llama:layers=1,hidden=32,heads=4,kv_heads=4,ffn=66,vocab=64,seq=8", 4, "ffn=66"),
])
def test_tp_not_dividing_is_a_plan_error_naming_the_field(spec, tp, field):
    block = load_model(spec).build("meta").blocks[0]
    with pytest.raises(PlanError, match=field):
        _rw(block, tp=tp)


def test_sequence_parallel_needs_divisible_sequence():
    block = load_model(GPT).build("meta").blocks[0]
    with pytest.raises(PlanError, match="sequence_parallel"):
        _rw(block, sp=True, x=torch.zeros(1, 7, 32, device="meta"))


def _compiles(path):
    with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec")


def test_cli_apply_emit(tmp_path, capsys):
    from autopar.cli.main import main
    plan = '{"tp": 2, "pp": 2, "sequence_parallel": true, "recompute": "selective", "attention": "math"}'
    out = tmp_path / "emit"
    assert main(["apply", GPT, "--plan", plan, "--emit", str(out)]) == 0
    files = sorted(os.listdir(out))
    assert files == ["SUMMARY.md", "stage0_tp0.py", "stage0_tp1.py", "stage1_tp0.py", "stage1_tp1.py"]
    for f in files[1:]:
        _compiles(out / f)
    summary = (out / "SUMMARY.md").read_text()
    for word in ("ReduceScatterSeq", "GatherSeq", "ScatterSeq", "GatherLastDim", "ReduceFromTP", "pipeline"):
        assert word in summary
    text = (out / "stage0_tp1.py").read_text()
    assert "class blocks_0(torch.nn.Module)" in text and "attention_core" in text


def test_cli_apply_emit_user_model_and_errors(tmp_path, capsys):
    from autopar.cli.main import main
    out = tmp_path / "user"
    assert main(["apply", f"{FIXTURE}:gpt", "--plan", '{"tp": 2, "recompute": "full"}', "--emit", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["SUMMARY.md", "stage0_tp0.py", "stage0_tp1.py"]
    _compiles(out / "stage0_tp0.py")
    capsys.readouterr()
    assert main(["apply", GPT, "--plan", '{"tp": 3}', "--emit", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autopar: error:") and "heads=4" in err and "\n" not in err
