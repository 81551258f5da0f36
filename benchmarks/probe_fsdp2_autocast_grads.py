"""Probe (issue 31): autopar's runtime at ZeRO-2/3 (FSDP2) with m >= 2 micro-batches inside ONE
``torch.autocast`` region got WRONG gradients; ZeRO-0 (DDP), one micro-batch, or autocast's cache
off, were right. Fixed: the runtime casts anew per micro-batch
(autopar/runtime/step/schedules.py ``fresh_autocast_casts``); this probe now prints 0.000 both ways.

Why (read, not proved line by line): autocast caches each weight's bf16 cast for the region, so
from the second micro-batch on the casts' ``ToCopyBackward0`` nodes are older than every node of
the current graph and the engine runs them last (tests/
test_memory_autocast_grads.py pins the order). FSDP2's post-backward for a module fires from its
inputs' gradient, before those cast nodes have accumulated the weights' gradients of that
micro-batch; on the synced (last) micro-batch the reduce-scatter then misses them.
Who runs a whole step in one autocast region: ``autopar train`` (autopar/runtime/training/
loop.py, CUDA) and ``autopar validate``'s ranks (autopar/validate/rank.py). torchtitan does not
meet this: it uses FSDP2's MixedPrecisionPolicy, not autocast, with FSDP.

    python benchmarks/probe_fsdp2_autocast_grads.py
    # measured 2026-11-28 (2 gloo ranks, gpt:layers=2,hidden=64,heads=2,vocab=256,seq=16,
    # global batch 4, micro-batch 1, m = 2): max |grad - ZeRO-0| / max |grad| =
    #   autocast cache on:  ZeRO-2 0.604, ZeRO-3 0.604;   cache off: 0.0 and 0.0
    # after fresh_autocast_casts (same day): cache on 0.000 and 0.000; cache off 0.000 and 0.000
"""
from __future__ import annotations

import os

SPEC = "gpt:layers=2,hidden=64,heads=2,vocab=256,seq=16,dropout=0"


def rank_main(spec: str, cache: bool) -> dict:
    import warnings

    import torch

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    warnings.filterwarnings("ignore")
    adist.ensure_initialized(int(os.environ["WORLD_SIZE"]))
    src = load_model(spec)
    x, y = src.make_batch(4, seed=0)
    grads = {}
    for zero in (0, 2, 3):
        plan = Plan(dp=2, micro_batch_size=1, zero=zero, recompute="none")
        runner = apply(src.build("cpu", seed=0, attention=plan.attention), plan, loss_fn=src.loss, spec=spec)
        sl = slice(runner.dp_rank * 2, runner.dp_rank * 2 + 2)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
            runner.train_step(tuple(t[sl] for t in x), y[sl])
        gs = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in runner.parameters()]
        grads[zero] = torch.cat([g.float().flatten() for g in gs])
    return {z: float((grads[z] - grads[0]).abs().max() / grads[0].abs().max()) for z in (2, 3)}


if __name__ == "__main__":
    from autopar.runtime.verify.serial import spawn
    for cache in (True, False):
        err = spawn(rank_main, 2, SPEC, cache)[0]
        print(f"autocast cache {'on ' if cache else 'off'}: max |grad - ZeRO-0| / max |grad|: "
              f"ZeRO-2 {err[2]:.3f}, ZeRO-3 {err[3]:.3f}")
