"""Issue 28's overlap corrections: under interleaved 1F1B a model chunk's gradients sync after
its own last backward (Megatron-core, torch pipelining), so the dp sync hides behind more of the
backward; Megatron's overlap_p2p_comm hides the interleaved sends (NeMo 2 always sets it there);
torch's micro-pipeline TP (torchtitan async TP) fuses only the collectives a matmul consumes or
produces alone, so a block's backward reduce-scatters stay exposed."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
from synthetic_tables import llama_table

from autopar.search.costs import Costs
from autopar.search.precision_space import search_precisions
from autopar.search.space import Shape, configurations
from autopar.search.split_model import SplitModel, time_unit
from costmodels.calibration.nemo_recipes import with_p2p_overlap
from costmodels.contracts.plan import Plan
from costmodels.model.async_tp_fusion import unfused_bwd_reduce_scatter_s
from costmodels.model.coefficients import collective_slowdown, plan_row_times, row_coefficients
from costmodels.model.comm import collective_time
from costmodels.model.estimate import estimate
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.interleaved_dp_window import interleaved_window_factor
from costmodels.profiles.runtime import load_runtime, register_runtime

TABLE = llama_table(8, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
H100 = load_profile("h100-80g-sxm")
MEGATRON = "megatron:overlap_grad_reduce,overlap_param_gather"


def test_interleaved_dp_window_widens_only_where_chunks_sync_on_their_own():
    rt = load_runtime(MEGATRON)
    flat = Plan(dp=8, pp=4, micro_batch_size=1, zero=1, runtime=MEGATRON)
    inter = flat.with_(vpp=2, schedule="interleaved-1f1b")
    assert rt.dp_sync_per_chunk == 1 and load_runtime("megatron").dp_sync_per_chunk == 0
    assert load_runtime("autopar").dp_sync_per_chunk == 1   # torch pipelining: last_backward per stage
    assert interleaved_window_factor(flat, 1) == 1.0
    assert interleaved_window_factor(inter, 1) == 4 - 3 / 2
    assert interleaved_window_factor(inter, 0) == 1.0
    assert rt.dp_window_for(inter, 1.0) == (4 - 3 / 2) * rt.dp_window_for(flat, 1.0)
    # estimate: the same interleaved plan with the per-chunk sync off exposes more of the dp sync
    off = register_runtime(dataclasses.replace(rt, name="megatron-whole-rank-sync", dp_sync_per_chunk=0))
    short = llama_table(8, 2048, 16, 4, 5632, 32000, 256, model="llama-short")   # a sync longer than its window
    on_e = estimate(short, H100, inter, 32, 64)
    off_e = estimate(short, H100, inter.with_(runtime=off.name), 32, 64)
    assert 0.0 < on_e.breakdown_s["dp_exposed"] < off_e.breakdown_s["dp_exposed"]
    assert on_e.breakdown_s["compute"] == off_e.breakdown_s["compute"]


def test_async_tp_leaves_the_blocks_backward_reduce_scatters_exposed():
    arr = table_arrays(TABLE)
    plan = Plan(dp=1, tp=8, micro_batch_size=2, sequence_parallel=True, runtime="fsdp:async_tp")
    tier = H100.group_link(plan, "tp")
    atp = plan_row_times(arr, H100, plan, "bf16-mixed", load_runtime(plan.runtime))
    plain = plan_row_times(arr, H100, plan.with_(runtime="fsdp"), "bf16-mixed", load_runtime("fsdp"))
    blk = arr.is_block & (arr.tp_comm_bytes > 0)
    assert blk.any()
    _, rs = collective_time("reduce_scatter", arr.tp_comm_bytes * 2 / TABLE.micro_batch, 8, tier)
    keep = unfused_bwd_reduce_scatter_s(arr, load_runtime(plan.runtime), tier, 8, 2, True)
    np.testing.assert_allclose(keep[blk], (arr.tp_collectives * rs)[blk], rtol=1e-12)
    # the backward keeps at least its reduce-scatters, the forward pipelines everything
    assert (atp.tp_bwd_s[blk] >= keep[blk] * (1 - 1e-12)).all()
    assert (atp.tp_fwd_s[blk] < 0.5 * plain.tp_fwd_s[blk]).all()
    assert (atp.tp_bwd_s[blk] > atp.tp_fwd_s[blk]).all()
    # the LM head's input-gradient reduce-scatter has one producer matmul: fused
    assert not keep[~arr.is_block].any()
    # Transformer Engine's userbuffers pipeline the backward's reduce-scatters too
    assert not load_runtime("megatron:tp_comm_overlap").tp_bwd_reduce_scatter_exposed


def test_interleaved_sends_hide_where_the_recipe_overlaps_them():
    base = Plan(dp=2, pp=4, micro_batch_size=1, zero=1, runtime=MEGATRON)
    inter = base.with_(vpp=2, schedule="interleaved-1f1b")
    p2p = inter.with_(runtime=MEGATRON + ",overlap_p2p_comm")
    s = collective_slowdown(H100, load_runtime(p2p.runtime))
    plain, hidden = row_coefficients(TABLE, H100, inter), row_coefficients(TABLE, H100, p2p)
    assert plain.cut_p2p_s[1:].min() > 0 and 0 < s < 1
    np.testing.assert_allclose(hidden.cut_p2p_s, s * plain.cut_p2p_s, rtol=1e-12)
    # without interleaving Megatron batches its sends: exposed as before
    np.testing.assert_array_equal(row_coefficients(TABLE, H100, base.with_(runtime=p2p.runtime)).cut_p2p_s,
                                  row_coefficients(TABLE, H100, base).cut_p2p_s)
    # NeMo 2's callback sets it for every interleaved run; NeMo 1 only where the yaml says so
    assert with_p2p_overlap(MEGATRON, "", "NeMo 2 (Megatron-core + TE)", 4, 2).endswith(",overlap_p2p_comm")
    assert with_p2p_overlap(MEGATRON, "", "NeMo 2 (Megatron-core + TE)", 4, 1) == MEGATRON
    assert with_p2p_overlap(MEGATRON, "", "NeMo 1 (Megatron-core + TE)", 4, 2) == MEGATRON
    assert with_p2p_overlap(MEGATRON, "", "NeMo 24.09", 4, 2) == MEGATRON   # a container, not NeMo 2
    assert with_p2p_overlap("megatron", "overlap_p2p_comm true", "NeMo 1", 8, 12) == "megatron:overlap_p2p_comm"


def test_objective_equals_estimate_for_interleaved_megatron_and_async_tp():
    gpus, batch = 64, 256
    costs = Costs(TABLE, H100, batch)
    rng = random.Random(5)
    for fix, want in (({"runtime": MEGATRON + ",overlap_p2p_comm"}, lambda c: c.vpp > 1 and c.dp > 1),
                      ({"runtime": "fsdp:async_tp"}, lambda c: c.tp > 1 and c.sequence_parallel)):
        configs = [c for c in configurations(Shape.of(TABLE), gpus, batch, H100.link_domain, fix=fix,
                                             precisions=search_precisions(H100, fix)) if want(c)]
        assert configs
        for c in rng.sample(configs, min(3, len(configs))):
            n = len(TABLE.rows)
            cuts = sorted(rng.sample(range(1, n), c.pp * c.vpp - 1))
            stages = tuple(zip([0] + cuts, cuts + [n]))
            est = estimate(TABLE, H100, c.plan(stages), gpus, batch)
            terms = costs.terms(c)
            r = SplitModel(dataclasses.replace(terms, hbm=float(2 ** 60)), fixed_stages=stages, exact=True).solve()
            tol = time_unit(terms.time_lower_bound()) * n * 4 * (terms.m + 2)
            assert r.status == "optimal" and abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s)
            assert costs.quick_bound(c) <= est.step_time_s * (1 + 1e-9)
