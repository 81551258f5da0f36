"""The expert all-to-all on a rack-scale NVLink domain (costmodels.model.experts.ep_span): an ep
group inside one GB200 NVL72 rack runs on NVLink, not on the 4-GPU host's NICs; on an HGX node
(domain = host = 8 GPUs) nothing changes."""
from __future__ import annotations

from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.plan import Plan
from costmodels.model.experts import all_to_all_s, ep_comm
from costmodels.profiles.hardware_files import load_profile

TABLE = moe_table(4, 1024, 8, 8, 2048, 32000, 1024, experts=8, top_k=2, expert_ffn=2048)


def _plan(dp, tp, ep):
    return Plan(dp=dp, tp=tp, pp=1, micro_batch_size=1, zero=1, sequence_parallel=tp > 1,
                runtime="megatron", ep=ep, etp=tp)


def test_an_ep_group_inside_an_nvl72_rack_stays_on_nvlink():
    gb = load_profile("gb200-nvl72")
    plan = _plan(32, 4, 8)   # tp4 x ep8 = 32 ranks: 8 hosts of 4 GPUs, one rack
    comm = ep_comm(TABLE, gb, plan, [(0, len(TABLE.rows))], 8)
    assert comm and comm[0]["tier"] == "intra_node"
    nbytes = 1e9
    sent, secs = all_to_all_s(nbytes, plan, gb)
    a, b = gb.tier("intra_node").alpha_beta("all_to_all")
    assert float(sent) == nbytes * 7 / 8   # every other ep rank reached over NVLink
    assert abs(float(secs) - (a + nbytes * 7 / 8 / b)) < 1e-12


def test_an_ep_group_across_hgx_nodes_still_crosses_the_nics():
    h100 = load_profile("h100-80g-sxm")
    plan = _plan(32, 4, 8)   # tp4 x ep8 = 32 ranks: 4 HGX nodes
    comm = ep_comm(TABLE, h100, plan, [(0, len(TABLE.rows))], 8)
    assert comm and comm[0]["tier"] == "inter_node"
    nbytes = 1e9
    _, secs = all_to_all_s(nbytes, plan, h100)
    ia, ib = h100.tier("intra_node").alpha_beta("all_to_all")
    xa, xb = h100.tier("inter_node").alpha_beta("all_to_all")
    # 2 ep ranks per node (stride tp4 in an 8-GPU node): 1/8 on NVLink, 6/8 over the NICs
    assert abs(float(secs) - (xa + max(nbytes / 8 / ib, nbytes * 6 / 8 / xb))) < 1e-12
