"""Peak live tensor bytes of one train_step of autopar's runtime under pp > 1 with ZeRO-2/3:
its own pipeline stage against torch's behaviour (issue 31).

4 gloo ranks (torch 2.13 CPU), pp = 2, dp = 2, 1F1B, m = 4 micro-batches, fp32, gpt 8 x 384
(4 blocks a stage). Each rank runs one warm-up step and an SGD step, then one measured step: its
peak live CPU tensor bytes (``autopar.validate.live_bytes.LiveBytes``, the measurement
``autopar validate`` makes on a CPU; bytes allocated inside the step, what was live before it not
counted). "torch": ``ShardedGradStage`` given back torch's own ``backward_maybe_with_nosync`` and
``perform_reduce_grad`` (no gradient sync and no reshard before the last backward: what autopar
ran before issue 31); "autopar": the stage as it is (a reduce-scatter every micro-batch, ZeRO-3
resharded after each backward). Both run with ``return_outputs=False``.

    python benchmarks/measure_autopar_pp_zero_peak.py     # one line per rank, MB
"""
from __future__ import annotations

SPEC = "gpt:layers=8,hidden=384,heads=4,vocab=256,seq=8,dropout=0"


def _measure() -> dict[str, float]:
    import torch
    from torch.distributed.pipelining import PipelineStage

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from autopar.runtime.step import pipeline_stage as ps
    from autopar.validate.live_bytes import LiveBytes
    from costmodels.contracts.plan import Plan
    adist.ensure_initialized(4)
    src = load_model(SPEC)
    cls, out = ps.ShardedGradStage, {}
    own = (cls.backward_maybe_with_nosync, cls.perform_reduce_grad)
    torchs = (PipelineStage.backward_maybe_with_nosync, PipelineStage.perform_reduce_grad)
    try:
        for variant, methods in (("torch", torchs), ("autopar", own)):
            cls.backward_maybe_with_nosync, cls.perform_reduce_grad = methods
            for zero in (2, 3):
                plan = Plan(dp=2, pp=2, zero=zero, micro_batch_size=1, schedule="1f1b")
                runner = apply(src.build("cpu", seed=0), plan, loss_fn=src.loss, spec=SPEC)
                opt = torch.optim.SGD(runner.parameters(), lr=0.01)
                x, y = src.make_batch(8, seed=1)
                sl = slice(runner.dp_rank * 4, (runner.dp_rank + 1) * 4)
                inputs = tuple(t[sl] for t in x)
                runner.train_step(inputs, y[sl])
                opt.step()
                opt.zero_grad(set_to_none=True)
                with LiveBytes() as lb:
                    with lb.step():
                        runner.train_step(inputs, y[sl])
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                out[f"{variant} ZeRO-{zero}"] = lb.result()[0] / 1e6
                del runner, opt
    finally:
        cls.backward_maybe_with_nosync, cls.perform_reduce_grad = own
    return out


if __name__ == "__main__":
    from autopar.runtime.verify.serial import spawn
    for rank, res in enumerate(spawn(_measure, 4)):
        print(f"rank {rank} (stage {rank // 2}):", ", ".join(f"{k} {v:.1f}" for k, v in res.items()), "MB")
