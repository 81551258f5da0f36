"""The tensor-parallel rewrite where attention tensors are indexed by head without being a sharded
linear's output (autopar/rewrite/head_shards.py): Phi-3's fused qkv with grouped-query heads
sliced per part, OLMo-2's q/k RMSNorm over the projected width (statistics all-reduced, weight
sharded), BLOOM's ALiBi slopes cut to the rank's heads, DeBERTa-v2's (v3 attention) relative
positions. One process, ``FakeGroup``: what each rank's row holds; that the plans equal serial
training is ``tests/test_runtime_zoo.py``'s shared world and ``bench_runtime_zoo.py --more``."""
from __future__ import annotations

import functools
import os
import sys

import pytest
import torch

from autopar.rewrite import FakeGroup, collectives_of, rewrite_row
from autopar.rewrite.head_shards import index_dims, local_slice, rank_part
from autopar.runtime.assemble.prelaunch import row_inputs
from autopar.runtime.assemble.rows import model_rows

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import zoo  # noqa: E402

pytest.importorskip("transformers")


def _same(b):
    return b


def test_slices_of_a_split_dim_follow_the_parts():
    assert index_dims([Ellipsis, slice(None, 4)], 3) == [None, 2]
    assert index_dims([slice(None), None, 0, Ellipsis], 4) == [0, None, 1, None]
    parts = (32, 16, 16)   # Phi-3: q, k, v of 4 query heads and 2 kv heads of 8
    assert local_slice(slice(None, 32), 64, parts, 2, _same) == slice(0, 16)
    assert local_slice(slice(32, 48), 64, parts, 2, _same) == slice(16, 24)
    assert local_slice(slice(48, None), 64, parts, 2, _same) == slice(24, 32)
    assert local_slice(slice(40, 48), 64, parts, 2, _same) is None   # inside a part: refused
    x = torch.arange(64)
    mine = rank_part(x, 0, parts, 1, 2)
    assert mine.tolist() == [*range(16, 32), *range(40, 48), *range(56, 64)]


@functools.cache
def _rows(name, batch=1):   # cut once per family (read-only here: the rewrite copies what it cuts)
    model = zoo.build(name)
    inputs = zoo.zoo_batch(name, batch, 0)[0]
    rows = model_rows(model, inputs)
    return rows, row_inputs(rows, inputs, [(0, len(rows.modules))], range(1))


def _block(name, rank=0, sp=False, batch=1):
    rows, ins = _rows(name, batch)
    row = rows.modules[1]
    gm = rewrite_row(row, kind="block", tp_rank=rank, tp_size=2, tp_group=FakeGroup(rank, 2),
                     sequence_parallel=sp, recompute="none", example_input=ins.get(1))
    return row, gm


def test_phi3_fused_gqa_qkv_is_cut_per_part():
    row, gm = _block("phi3", rank=1)
    name = next(k for k in gm.autopar_shards if k.endswith("qkv_proj.weight"))
    spec = gm.autopar_shards[name]
    assert spec.dim == 0 and spec.segments == (32, 16, 16)
    serial = dict(row.named_parameters())[name]
    local = gm.get_parameter(name)
    assert torch.equal(local, torch.cat([serial[16:32], serial[40:48], serial[56:64]]))
    kinds = {v["kind"] for v in gm.autopar_info["pairs"].values()}
    assert kinds == {"attention", "mlp"}


def test_olmo2_qk_norm_statistics_are_all_reduced_and_its_weight_sharded():
    row, gm = _block("olmo2", rank=1)
    for which, width in (("q_norm", 32), ("k_norm", 16)):   # 4 query heads, 2 kv heads of 8
        name = next(k for k in gm.autopar_shards if k.endswith(f"{which}.weight"))
        assert gm.autopar_shards[name].dim == 0
        serial = dict(row.named_parameters())[name]
        assert serial.numel() == width
        torch.testing.assert_close(gm.get_parameter(name), serial[width // 2:])
    reduced = [c for c in collectives_of(gm) if c["module"] == "ReduceFromTP"]
    # two norm statistics, then the row-parallel attention and MLP outputs
    assert len(reduced) == 4 and sum("mean" in c["name"] for c in reduced) == 2, reduced


def test_bloom_alibi_is_cut_to_the_ranks_heads():
    row, gm = _block("bloom", rank=1)
    alibi = next(b for n, b in row.named_buffers() if b.dim() == 3)   # (batch·heads, 1, keys)
    local = next(b for n, b in gm.named_buffers() if b.dim() == 3 and b.shape[1] == 1)
    assert tuple(local.shape) == (2, 1, 8)
    torch.testing.assert_close(local, alibi[2:])


def test_bloom_last_block_passes_only_the_hidden_state_to_the_head():
    """BLOOM's last block returns (hidden, attention probs); only the hidden state crosses to the
    head (the attention probs would leave the block sharded by head)."""
    rows, ins = _rows("bloom")
    head_in = ins.get(len(rows.modules) - 1)
    assert isinstance(head_in, torch.Tensor) and tuple(head_in.shape) == (1, 8, 32)


def test_deberta_relative_attention_shards_with_the_heads_under_sp():
    """DeBERTa-v3's disentangled attention: the relative-position index (batch·heads, q, k) is cut
    to the rank's heads, the shared key/query projections of the position embeddings are column
    parallel, and under sequence parallel only the hidden state of the embedding row's
    (hidden, rel_embeddings) is split over the sequence."""
    rows, ins = _rows("deberta_v2")
    emb = rewrite_row(rows.modules[0], kind="embedding", tp_rank=0, tp_size=2, tp_group=FakeGroup(0, 2),
                      sequence_parallel=True, recompute="none", example_input=ins.get(0))
    hidden, rel = emb(*zoo.zoo_batch("deberta_v2", 1, 0)[0])
    assert tuple(hidden.shape) == (1, 4, 32) and tuple(rel.shape) == (8, 32)
    _, gm = _block("deberta_v2", sp=True)
    code = gm.code
    assert code.count("rank_part(") == 2 and "sp_gather" in code and "copy_to_tp" in code
    out = gm(hidden, rel)
    assert tuple(out[0].shape) == (1, 4, 32) and tuple(out[1].shape) == (8, 32)


def test_heads_merged_with_the_batch_are_cut_per_batch_row():
    """BLOOM at micro-batch 2 computes scores as (batch·heads, q, k): the rank's part of that dim
    is its heads of each batch row, and so is the part of the ALiBi bias it gets."""
    x = torch.arange(8).view(8, 1)   # batch 2 × heads 4
    assert rank_part(x, 0, (8,), 1, 2, outer=2).flatten().tolist() == [2, 3, 6, 7]
    row, gm = _block("bloom", rank=1, batch=2)
    assert "rank_part(_tensor_constant1, 0, (8,), 1, 2, 2)" in gm.code.replace("\n", " "), gm.code
