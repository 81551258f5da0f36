"""The runtime's context-parallel attention on CUDA against plain torch (issue 26's GPU check).

A tiny Llama (GQA, rotary, ``F.scaled_dot_product_attention``) gets one SGD-free step — forward,
loss, backward — in plain torch and through the runtime, on the same weights and batch; each line
prints the loss, max |Δ loss| and max |Δ grad| over every parameter (and the largest |grad|, to
read it against), and PASS where both are within the tolerance of the dtype.

One process (``python benchmarks/bench_runtime_cp_cuda.py``), on one GPU:

* ``runner cp=1``: ``autopar.apply(model, Plan())`` with no process group started, as a user on
  one GPU runs it — the Runner starts a one-process NCCL group and trains on the GPU; at cp = 1
  it rewrites no row (``assemble.stages``: only ``plan.cp > 1``), the model's own SDPA runs;
* ``cp-op torch-ring cp=1``: every block rewritten by the cp pass (``autopar.rewrite.context_
  parallel``) for cp = 1 over that one-rank NCCL group, so its attention is
  ``ContextParallelAttention`` choosing torch's context-parallel SDPA (DTensors on a 1-device
  mesh: ``autopar.rewrite.cp_torch_ring``) — the CUDA code path cp > 1 takes, on one GPU;
* ``cp-op all-gather cp=1``: the same with ``AUTOPAR_CP_TORCH_RING=0`` (our all-gather op on CUDA).

Under ``torchrun --nproc-per-node N`` (N > 1 GPUs): ``runner cp=N`` and the same with
``AUTOPAR_CP_TORCH_RING=0``, each rank comparing with plain torch on the whole batch (rank 0 prints).

    python benchmarks/bench_runtime_cp_cuda.py [--dtype fp32|bf16] [--seq 256] [--batch 2]

Tolerance (stated before any run): fp32 (TF32 off) loss within 1e-5 relative and every gradient
within 1e-4 of the largest |grad|; bf16: 2e-2 and 5e-2. Needs CUDA; on CPU it refuses in one line
(the gloo cp path is checked there by ``autopar verify`` and tests/test_runtime_context_parallel.py).
Imports nothing of the search (no ortools).

Run so far (one H200, torch 2.11.0+cu130, the session that wrote it; the device machine runs a
copy of the main tree, so this file's steps were run there inline, on main's code plus the
one-process NCCL start of ``faults/dist.py`` patched in; this file as a whole was not run):
seq 256, batch 2 — ``runner cp=1``: backend nccl, cuda:0, |Δ loss| 0, max |Δ grad| 0 (main's tree:
gloo, the Runner on the CPU); ``cp-op torch-ring cp=1``: fp32 and bf16 |Δ loss| 0, max |Δ grad| 0;
``cp-op all-gather cp=1``: fp32 9.3e-9, bf16 1.8e-4 (max |grad| 0.0195). cp = 2 over two GPUs: not
run (one GPU lent).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SPEC = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=128,seq={seq}"
TOL = {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 5e-2)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def grads_of(named) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().clone() for n, p in named if p.grad is not None}


def serial_step(model, source, inputs, targets):
    """Plain torch: loss and gradients by name."""
    model.zero_grad(set_to_none=True)
    loss = source.loss(model(*inputs), targets)
    loss.backward()
    return float(loss.detach()), grads_of(model.named_parameters())


def cp_op_step(model, source, inputs, targets, group):
    """Every block rewritten by the cp pass for cp = 1 over ``group`` (a one-rank NCCL group):
    its attention is ContextParallelAttention. Returns (loss, grads, the kernel it chose)."""
    from autopar.rewrite import rewrite_row
    from autopar.rewrite.cp_attention import ContextParallelAttention
    from autopar.rewrite.cp_torch_ring import kernel_for
    model = copy.deepcopy(model)
    kernels = set()
    for i, block in enumerate(model.blocks):
        gm = rewrite_row(block, kind="block", tp_rank=0, tp_size=1, tp_group=None,
                         sequence_parallel=False, recompute="none",
                         context_parallel=dict(cp=1, rank=0, group=group, name=f"blocks.{i}"))
        ops = [m for m in gm.modules() if isinstance(m, ContextParallelAttention)]
        assert ops, f"blocks.{i}: no cp attention after the rewrite"
        kernels |= {kernel_for(inputs[0].new_empty(0, dtype=torch.float32), op.group, op.sdpa) for op in ops}
        model.blocks[i] = gm
    loss, grads = serial_step(model, source, inputs, targets)
    return loss, grads, ",".join(sorted(kernels))


def runner_step(model, source, inputs, targets, cp: int, batch: int):
    """``autopar.apply`` under Plan(cp=cp, micro_batch_size=batch): the runtime end to end."""
    import autopar
    runner = autopar.apply(copy.deepcopy(model).cpu(), autopar.Plan(cp=cp, micro_batch_size=batch),
                           loss_fn=source.loss, example_inputs=tuple(t[:batch].cpu() for t in inputs))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False   # Runner sets TF32 on
    loss = runner.train_step(inputs, targets)
    return loss, grads_of(runner.named_parameters()), str(runner.device)


def compare(name, ref, got, dtype, extra="") -> bool:
    (l0, g0), (l1, g1) = ref, got
    rtol, gtol = TOL[dtype]
    dl = abs(l1 - l0)
    missing = sorted(set(g0) - set(g1))
    dg = max((float((g1[n] - g0[n]).abs().max()) for n in g0 if n in g1), default=float("inf"))
    gmax = max(float(g.abs().max()) for g in g0.values())
    ok = not missing and dl <= rtol * abs(l0) and dg <= gtol * gmax
    print(f"{name:<26} {extra:<12} loss {l1:.6f}  |dloss| {dl:.2e}  max|dgrad| {dg:.2e}  "
          f"(max|grad| {gmax:.2e}{', missing ' + str(len(missing)) if missing else ''})  "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("autopar: error: bench_runtime_cp_cuda needs a CUDA GPU (torch's context-parallel "
              "attention runs only on CUDA over NCCL); on CPU the gloo cp path is checked by "
              "`autopar verify` and tests/test_runtime_context_parallel.py", file=sys.stderr)
        return 2
    from autopar.models import load_model
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    source = load_model(SPEC.format(seq=args.seq))
    dtype = DTYPES[args.dtype]
    model = source.build("cuda", seed=0, attention="flash", dtype=dtype)
    inputs, targets = source.make_batch(args.batch, seed=1, device="cuda")
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    t0 = time.monotonic()
    ok = True
    say = print if world == 1 or int(os.environ.get("RANK", "0")) == 0 else (lambda *a, **k: None)
    if world == 1:   # the Runner first: it starts the one-process NCCL group the cp op then uses
        got = runner_step(model, source, inputs, targets, 1, args.batch)
        ref = serial_step(model, source, inputs, targets)
        say(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.dtype}, "
            f"seq {args.seq}, batch {args.batch}, backend {dist.get_backend()}")
        ok &= compare("runner cp=1", ref, got[:2], args.dtype, got[2])
        for switch, label in (("1", "torch-ring"), ("0", "all-gather")):
            os.environ["AUTOPAR_CP_TORCH_RING"] = switch
            loss, grads, kernel = cp_op_step(model, source, inputs, targets, dist.group.WORLD)
            ok &= compare(f"cp-op {label} cp=1", ref, (loss, grads), args.dtype, kernel)
    else:
        for switch, label in (("1", "torch-ring"), ("0", "all-gather")):
            os.environ["AUTOPAR_CP_TORCH_RING"] = switch
            got = runner_step(model, source, inputs, targets, world, args.batch)
            ref = serial_step(model, source, inputs, targets)
            mine = compare(f"runner cp={world} {label}", ref, got[:2], args.dtype, got[2]) if say is print \
                else _quiet_compare(ref, got[:2], args.dtype)
            ok &= mine
        flags = torch.tensor([int(ok)], device="cuda")
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        ok = bool(flags.item())
    say(f"{'all PASS' if ok else 'FAIL'} in {time.monotonic() - t0:.1f} s", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


def _quiet_compare(ref, got, dtype) -> bool:
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return compare("", ref, got, dtype)


if __name__ == "__main__":
    sys.exit(main())
