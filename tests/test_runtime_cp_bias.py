"""A position-dependent attention bias under context parallelism (issue 26): ALiBi or a learned
relative bias, folded into the causal mask, added beside it or passed to SDPA as a float mask
(tests/fixtures/alibi.py), is refused in one line naming the module, where it used to run as plain
causal attention and train the wrong model silently (a 2-rank gloo world on the previous tree:
losses 2.2e-3 relative off serial). The same graphs without a bias run. Without processes, as
tests/test_runtime_cp_mask_check.py does: the block is rewritten for each cp rank with a
FakeGroup, the masks each rank's cp op receives are captured from a forward, and the counts the
op all-reduces are summed over the ranks as the all-reduce would. Beside it, the CUDA path's
choice (gloo all-gather op vs torch's context-parallel SDPA) and the one-GPU start-up, on CPU."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
from alibi import STYLES, BiasedBlock  # noqa: E402

CP, T_SERIAL, D, H = 2, 16, 16, 4


def _rank_terms(block, rank: int):
    """(the mask terms cp rank ``rank``'s op checks in one forward, the op)."""
    from autopar.rewrite import FakeGroup, rewrite_row
    from autopar.rewrite.cp_attention import ContextParallelAttention
    t = T_SERIAL // CP
    x = torch.randn(1, t, D, generator=torch.Generator().manual_seed(rank))
    gm = rewrite_row(block, kind="block", tp_rank=0, tp_size=1, tp_group=None, sequence_parallel=False,
                     recompute="none", example_input=x,
                     context_parallel=dict(cp=CP, rank=rank, group=FakeGroup(rank, CP), name="blocks.1"))
    [op] = [m for m in gm.modules() if isinstance(m, ContextParallelAttention)]
    got = {}
    op.register_forward_pre_hook(lambda m, args: got.update(masks=args[4:]))
    gm(x)
    kinds = [(op.mask_kind, op.mask_whole)] + list(op.more_masks)
    assert len(got["masks"]) == len(kinds) >= 1   # the bias reaches the op (a buffer's slopes too)
    return [(m, k, w) for m, (k, w) in zip(got["masks"], kinds)], op


def _summed_counts(block) -> tuple[int, int, int]:
    from autopar.rewrite.cp_attention import load_balanced_positions
    from autopar.rewrite.cp_mask_check import terms_counts
    counts = [terms_counts(_rank_terms(block, r)[0], load_balanced_positions(T_SERIAL // CP, CP, r))
              for r in range(CP)]
    return tuple(sum(c[i] for c in counts) for i in range(3))


@pytest.mark.parametrize("style", STYLES)
def test_a_position_bias_is_counted_on_every_rank_and_the_same_graph_without_one_is_not(style):
    torch.manual_seed(0)
    hidden, differ, biased = _summed_counts(BiasedBlock(D, H, style))
    assert hidden == 0 and differ == 0   # causal where it hides: only the bias is wrong under cp
    # per head, every local query row but the two (one per rank) that see a single local key; the
    # bias added beside the mask is a term of its own, over every key: all 16 rows
    assert biased == H * (T_SERIAL if style == "beside" else T_SERIAL - CP)
    assert _summed_counts(BiasedBlock(D, H, style, slope=0.0)) == (0, 0, 0)


def test_the_step_is_refused_in_one_line_naming_the_module(monkeypatch):
    import autopar.rewrite.cp_mask_check as check
    from autopar.rewrite.cp_attention import load_balanced_positions
    terms, op = _rank_terms(BiasedBlock(D, H, "beside"), 0)
    assert [k for _, k, _ in terms] == ["additive", "fill"]   # the bias and the causal fill, both checked
    monkeypatch.setattr(check.dist, "all_reduce", lambda tensor, group=None: None)
    with pytest.raises(PlanError) as e:
        check.refuse_terms(terms, load_balanced_positions(T_SERIAL // CP, CP, 0), None, CP, op.where)
    line = str(e.value)
    assert "\n" not in line and "'blocks.1'" in line and "ALiBi" in line and "cp=1" in line


def test_only_a_bias_that_varies_along_a_query_row_counts():
    from autopar.rewrite.cp_mask_check import biased_rows
    causal = torch.zeros(4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
    assert biased_rows(causal, "additive", 4) == 0
    assert biased_rows(causal + torch.arange(4.0)[:, None], "additive", 4) == 0   # constant per row
    assert biased_rows(causal + torch.arange(4.0)[None, :], "attend", 4) == 3     # rows 1-3 see ≥ 2 keys
    assert biased_rows(torch.ones(4, 4, dtype=torch.bool).tril(), "attend", 4) == 0   # bool: no bias
    assert biased_rows(torch.arange(4.0).view(1, 1, 4), "additive", 4) == 1      # key-only (BLOOM-style)


@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa", "written-out"])
def test_a_bias_table_read_from_a_buffer_is_refused_and_a_causal_one_is_dropped(sdpa):
    """A whole ALiBi mask precomputed into a buffer is refused when the row is rewritten (no
    step needed); the same buffer without the bias (0 / -inf, the causal mask a trace folds)
    runs, and is not handed to the op: the op applies causality itself."""
    import torch.nn as nn
    import torch.nn.functional as F

    from autopar.rewrite import FakeGroup, rewrite_row
    from autopar.rewrite.cp_attention import ContextParallelAttention

    class Precomputed(nn.Module):
        def __init__(self, slope):
            super().__init__()
            self.qkv = nn.Linear(D, 3 * D)
            pos = torch.arange(T_SERIAL)
            rel = slope * (pos[None, :] - pos[:, None]).float()
            self.register_buffer("alibi", rel.masked_fill(pos[None, :] > pos[:, None], float("-inf"))[None, None])

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.alibi[:, :, :T, :T])
            else:
                y = torch.softmax(q @ k.transpose(-2, -1) + self.alibi[:, :, :T, :T], dim=-1) @ v
            return x + y.transpose(1, 2).reshape(B, T, D)

    def rewritten(slope):
        return rewrite_row(Precomputed(slope), kind="block", tp_rank=0, tp_size=1, tp_group=None,
                           sequence_parallel=False, recompute="none", example_input=torch.randn(1, 8, D),
                           context_parallel=dict(cp=CP, rank=0, group=FakeGroup(0, CP), name="blocks.0"))

    with pytest.raises(PlanError, match="position bias"):
        rewritten(1.0)
    [op] = [m for m in rewritten(0.0).modules() if isinstance(m, ContextParallelAttention)]
    assert op.causal and op.mask_kind is None


def test_transformers_falcon_with_alibi_is_refused_when_its_block_is_rewritten():
    """transformers' Falcon with ``alibi=True``, cut by tracing for cp rank 0: the trace folds its
    ALiBi into a constant table added to the scores, which the rewrite refuses naming the block.
    (In a 2-rank gloo world the previous tree ran it 4.9e-4 loss / 3.0e-2 parameter off serial.)
    The pre-launch probe runs on meta copies, so this is the ranks' rewrite, as the Runner's."""
    T = pytest.importorskip("transformers")
    from autopar.rewrite import FakeGroup, rewrite_row
    from autopar.runtime.assemble.prelaunch import check_before_launch
    from autopar.runtime.assemble.stages import row_inputs
    from autopar.runtime.step.context import local_example, rows_for_cp_rank
    torch.manual_seed(0)
    cfg = T.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         alibi=True, max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
    cfg._attn_implementation = "eager"
    model, plan = T.FalconForCausalLM(cfg), Plan(cp=CP)
    ids = (torch.zeros(1, 16, dtype=torch.long),)
    ready = check_before_launch(model, plan, example_inputs=ids)
    local = local_example(ids, plan)
    rows = rows_for_cp_rank(model, ready.rows, local, plan, 0)
    x = row_inputs(rows, local, ready.stages, range(len(ready.stages)))
    i = rows.kinds.index("block")
    with pytest.raises(PlanError, match="position bias") as e:
        rewrite_row(rows.modules[i], kind="block", tp_rank=0, tp_size=1, tp_group=None, sequence_parallel=False,
                    recompute="none", example_input=x[i],
                    context_parallel=dict(cp=CP, rank=0, group=FakeGroup(0, CP), name=rows.names[i]))
    assert "'transformer.h.0'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("facts, kernel", [
    (dict(real_group=False, device_type="cpu", backend=None, sdpa=True, api=True, switch=None), "shape-probe"),
    (dict(real_group=True, device_type="meta", backend="gloo", sdpa=True, api=True, switch=None), "shape-probe"),
    (dict(real_group=True, device_type="cpu", backend="gloo", sdpa=True, api=True, switch=None), "all-gather"),
    (dict(real_group=True, device_type="cuda", backend="nccl", sdpa=True, api=True, switch=None), "torch-ring"),
    (dict(real_group=True, device_type="cuda", backend="nccl", sdpa=True, api=True, switch="1"), "torch-ring"),
    (dict(real_group=True, device_type="cuda", backend="nccl", sdpa=True, api=True, switch="0"), "all-gather"),
    (dict(real_group=True, device_type="cuda", backend="nccl", sdpa=False, api=True, switch=None), "all-gather"),
    (dict(real_group=True, device_type="cuda", backend="nccl", sdpa=True, api=False, switch=None), "all-gather"),
    (dict(real_group=True, device_type="cuda", backend="gloo", sdpa=True, api=True, switch=None), "all-gather"),
], ids=["fake-group", "meta", "gloo-cpu", "nccl-sdpa", "switch-on", "switch-off", "written-out-core",
        "no-api", "gloo-cuda"])
def test_the_cp_attention_kernel_choice(facts, kernel):
    """What ContextParallelAttention runs, from the facts alone (cp_torch_ring.choose_kernel):
    torch's context-parallel SDPA only for an SDPA call on CUDA over NCCL."""
    from autopar.rewrite.cp_torch_ring import choose_kernel
    assert choose_kernel(**facts) == kernel


def test_cp1_rewrites_no_attention_and_one_gpu_starts_nccl_not_gloo(monkeypatch):
    """cp = 1 short-circuits: no row goes through the cp pass (recompute still rewrites), so one
    GPU runs the model's own SDPA; and a one-process ``apply`` without torchrun starts NCCL where
    CUDA is available (it used to start gloo, so the Runner trained on the CPU)."""
    from autopar.models import load_model
    from autopar.rewrite.cp_attention import ContextParallelAttention
    from autopar.runtime.assemble.stages import rewrite, rewrites
    from autopar.runtime.faults import dist as adist
    assert not rewrites(Plan(cp=1))
    block = load_model("llama:layers=1,hidden=16,heads=2,kv_heads=1,ffn=32,vocab=32,seq=8").build(
        "cpu", seed=0, attention="flash").blocks[0]
    row = rewrite(block, "block", torch.randn(1, 8, 16), Plan(cp=1, recompute="full"), 0, None, "blocks.0")
    assert row is not block and not any(isinstance(m, ContextParallelAttention) for m in row.modules())
    started = {}
    monkeypatch.setattr(adist.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(adist.dist, "init_process_group", lambda backend, **kw: started.update(backend=backend))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.setenv(var, os.environ.get(var, "set-by-test"))   # set_env leaves set ones alone
    for cuda, backend in ((False, "gloo"), (True, "nccl")):
        monkeypatch.setattr(adist.torch.cuda, "is_available", lambda cuda=cuda: cuda)
        adist.ensure_initialized(1)
        assert started.pop("backend") == backend
    with pytest.raises(PlanError, match="torchrun"):
        adist.ensure_initialized(2)
