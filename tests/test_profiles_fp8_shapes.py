"""FP8 GEMM shape rules (costmodels/profiles/fp8_shapes.py): Transformer Engine's
``assert_dim_for_fp8_exec`` (megatron) and ``torch._scaled_mm``'s multiples of 16 behind
torchtitan's float8 (fsdp), enforced by ``estimate`` in one line and by the search's space.

The model is Llama 2 7B's MLP ratio at an eighth of the width (ffn 1376 = 11008 / 8), so its
row-parallel ``w2`` shard at tp 4 is 344 wide, as Llama 2 7B's is at tp 32."""
from __future__ import annotations

import pytest

from autopar.search.space import Shape, configurations
from autopar.trace import table_for
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate

SPEC = "llama:layers=2,hidden=512,heads=32,kv_heads=32,ffn=1376,vocab=1024"
MEGATRON = "megatron:overlap_grad_reduce"


@pytest.fixture(scope="module")
def table():
    return table_for(SPEC, micro_batch=1, seq=256)


def _plan(tp, precision="fp8", runtime=MEGATRON, sp=True, zero=1, mbs=1):
    return Plan(dp=8 // tp, tp=tp, micro_batch_size=mbs, zero=zero if tp < 8 else 0,
                sequence_parallel=sp and tp > 1, precision=precision, runtime=runtime)


def test_transformer_engine_refuses_a_shard_off_16_in_one_line(table):
    with pytest.raises(PlanError) as e:
        estimate(table, "h100-80g-sxm", _plan(4), 8, 8)
    msg = str(e.value)
    assert "\n" not in msg and "[512, 1376] is [512, 344]" in msg and "assert_dim_for_fp8_exec" in msg
    assert "tp in [1, 2]" in msg            # 688 % 16 == 0; 344 and 172 are not
    assert estimate(table, "h100-80g-sxm", _plan(2), 8, 8).step_time_s > 0
    assert estimate(table, "h100-80g-sxm", _plan(4, "bf16"), 8, 8).step_time_s > 0   # BF16 has no rule


def test_transformer_engine_token_rows_per_rank(table):
    # 256 tokens / (cp 4 · sp over tp 2) = 32 rows per rank: a multiple of 8, runs
    ok = Plan(dp=1, cp=4, tp=2, micro_batch_size=1, sequence_parallel=True, precision="fp8", runtime=MEGATRON)
    assert estimate(table, "h100-80g-sxm", ok, 8, 1).step_time_s > 0
    short = table_for(SPEC, micro_batch=1, seq=24)   # 24 / 2 (sp) = 12 rows: not a multiple of 8
    with pytest.raises(PlanError, match="12 token rows"):
        estimate(short, "h100-80g-sxm", _plan(2), 8, 8)


def test_torchao_rule_binds_converted_linears_only(table):
    with pytest.raises(PlanError, match=r"torch\._scaled_mm"):
        estimate(table, "h100-80g-sxm", _plan(4, runtime="fsdp", zero=3), 8, 8)
    # a width torchtitan's converter leaves in BF16 (1368 % 16 = 8): nothing to refuse under fsdp,
    # while Transformer Engine converts every linear and refuses it at any tp
    odd = table_for(SPEC.replace("ffn=1376", "ffn=1368"), micro_batch=1, seq=256)
    assert estimate(odd, "h100-80g-sxm", _plan(2, runtime="fsdp", zero=3), 8, 8).step_time_s > 0
    with pytest.raises(PlanError, match="1368"):
        estimate(odd, "h100-80g-sxm", _plan(1, sp=False), 8, 8)
    with pytest.raises(PlanError, match="1368"):   # Composer (fsdp:fsdp1) runs te.Linear: TE's rule
        estimate(odd, "h100-80g-sxm", _plan(1, runtime="fsdp:fsdp1", sp=False, zero=3), 8, 8)
    # autopar's own runtime keeps such a shard in BF16 (assemble/float8.py): no rule
    assert estimate(table, "h100-80g-sxm", _plan(4, runtime="autopar", zero=1), 8, 8).step_time_s > 0


def test_search_never_offers_what_estimate_refuses(table):
    shape = Shape.of(table)
    fix = {"runtime": MEGATRON}
    tps = {(c.tp, c.precision) for c in configurations(shape, 16, 16, 8, fix, True,
                                                         precisions=("bf16", "fp8"))}
    assert {(4, "bf16"), (8, "bf16"), (16, "bf16"), (2, "fp8"), (1, "fp8")} <= tps
    assert not {(4, "fp8"), (8, "fp8"), (16, "fp8")} & tps


def test_pinned_search_names_the_rule(table):
    from autopar.search import search
    from costmodels.contracts.errors import AutoparError
    with pytest.raises(AutoparError, match=r"precision=fp8 at tp=4 .*\[512, 344\]"):
        search(SPEC, "h100-80g-sxm", 8, 8, fix={"tp": 4, "precision": "fp8", "runtime": MEGATRON},
               top=1, table=table, time_limit_s=5)


def test_profile_names_a_known_rule():
    from pathlib import Path

    from costmodels.contracts.errors import ProfileError
    from costmodels.contracts.files import tomllib
    from costmodels.profiles.runtime import parse_runtime
    data = tomllib.loads((Path(__file__).parents[1] / "runtime-profiles" / "megatron.toml").read_text())
    assert parse_runtime(data).fp8_gemm_shapes == "transformer-engine"
    data["capabilities"]["fp8_gemm_shapes"] = "cublas"
    with pytest.raises(ProfileError, match="fp8_gemm_shapes.*transformer-engine, torch-scaled-mm"):
        parse_runtime(data)
