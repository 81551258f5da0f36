"""Expert parallelism in autopar's runtime (autopar/runtime/step/experts.py) equals the serial
model: losses of 5 SGD steps within 1e-5 relative and the gathered parameters within 1e-4, on
gloo, for ep2, ep2·dp2 with DDP, ZeRO-1 and ZeRO-3, ep2·pp2, ep2·tp2 (tp on attention and the
shared experts) with full recompute, and ep2·tp2 with sequence parallel, ZeRO-1 and selective
recompute on the ``moe`` family (a leading dense block, a shared expert, 4 experts of which 2 per
token), ep2 / ep2·dp2 ZeRO-1 / ep2·dp4 ZeRO-3 (expert-dp 2) on transformers' Mixtral and
Qwen2-MoE built from small configs (tests/data/*-small.json), and ep2·tp2 on Qwen2-MoE (its
shared expert tensor-parallel). One
world of 4 processes for all; plans the runtime cannot run (etp; sequence parallel on
transformers' MoE blocks) are refused before it starts, in one line."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from world_prefetch import Job, result

from autopar.runtime.verify import sweep

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import moe_over_tp  # noqa: E402  (tests/fixtures: the ep-over-tp cases this world also runs)

pytestmark = pytest.mark.slow

CASES = [sweep.SweepCase("moe", tuple(sorted(p.items())), m) for p, m in (
    (dict(dp=2, ep=2), 2),
    (dict(dp=4, ep=2), 2),
    (dict(dp=4, ep=2, zero=1), 2),
    (dict(dp=4, ep=2, zero=3), 2),
    (dict(dp=2, pp=2, ep=2), 4),
    (dict(dp=2, tp=2, ep=2, recompute="full"), 2),   # tp on the dense parts; the all-to-alls replay
    (dict(dp=2, tp=2, ep=2, sequence_parallel=True, zero=1, recompute="selective"), 2),
)] + [sweep.SweepCase(hf, tuple(sorted(p.items())), 2) for hf in ("mixtral", "qwen2moe")
      for p in (dict(dp=2, ep=2), dict(dp=4, ep=2, zero=1))] + [
    sweep.SweepCase("qwen2moe", (("dp", 2), ("ep", 2), ("tp", 2)), 2)] + [
    # issue 27's must-show on both transformers models: ep2 with tp2 on the dense parts, ep2·pp2
    sweep.SweepCase("mixtral", (("dp", 2), ("ep", 2), ("tp", 2)), 2)] + [
    sweep.SweepCase(hf, (("dp", 2), ("ep", 2), ("pp", 2)), 4) for hf in ("mixtral", "qwen2moe")] + [
    # issue 27 (etp7): ZeRO-3 at expert-dp 2 on transformers' experts, kept whole by FSDP2
    sweep.SweepCase(hf, (("dp", 4), ("ep", 2), ("zero", 3)), 2) for hf in ("mixtral", "qwen2moe")] + [
    sweep.SweepCase("moe-clip", (("dp", 4), ("ep", 2), ("zero", 1)), 2)]   # + clip_grad_norm_
HF = {name: f"hf:{Path(__file__).parent / 'data' / f'{name}-small.json'}" for name in ("mixtral", "qwen2moe")}


def make_case(model, plan, micro_batches, steps):
    """sweep's case for the moe family; transformers' models from their small configs."""
    if model == "moe-clip":   # the runner's clipping by the serial norm counts each expert once
        import dataclasses
        return dataclasses.replace(sweep.make_spec_case("moe", plan, micro_batches, steps), clip=0.05)
    if model not in HF:
        return sweep.make_spec_case(model, plan, micro_batches, steps)
    from autopar.models import load_model
    from autopar.runtime.verify.serial import Case, no_dropout
    source = load_model(HF[model])
    gb = plan.dp * plan.micro_batch_size * micro_batches
    return Case(model, plan, lambda: no_dropout(source.build("cpu", seed=0)),
                lambda step: source.make_batch(gb, seed=100 + step), source.loss, steps=steps,
                spec=HF[model])
REFUSED = [(sweep.SweepCase("moe", tuple(sorted(p.items())), 2), words) for p, words in (
    (dict(dp=2, tp=2, ep=2, etp=2), ["'etp'=2", "expert tensor"]),
)] + [(sweep.SweepCase("qwen2moe", (("dp", 2), ("ep", 2), ("sequence_parallel", True), ("tp", 2)), 2),
       ["'sequence_parallel'=true", "MoE blocks"])]   # transformers' MoE flattens the sequence shard
DENSE_EP = (sweep.SweepCase("llama", (("dp", 2), ("ep", 2)), 2), ["'ep'=2", "has none"])


# one world of 4 processes for all, run ahead of this module's turn (tests/world_prefetch.py);
# it also runs the ep-over-tp cases and checkpoint of tests/test_runtime_experts_over_tp.py
PREFETCH_WORLD = Job(sweep.run, (CASES + [c for c, _ in REFUSED] + [DENSE_EP[0]] + moe_over_tp.CASES,),
                     dict(world=4, steps=5, make_case=make_case, then=moe_over_tp.moe_checkpoint,
                          then_args=(moe_over_tp.checkpoint_dir(),)))


@pytest.fixture(scope="module")
def results():
    return result(__name__, PREFETCH_WORLD).results


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_ep_equals_serial(results, case):
    res = results[case.name]
    assert res["status"] == "pass", res


@pytest.mark.parametrize("case, words", REFUSED + [DENSE_EP], ids=lambda x: getattr(x, "name", ""))
def test_ep_plans_the_runtime_cannot_run_are_refused_before_launch(results, case, words):
    res = results[case.name]
    assert res["status"] == "refused" and "\n" not in res["line"], res
    for w in words:
        assert w in res["line"], res["line"]
