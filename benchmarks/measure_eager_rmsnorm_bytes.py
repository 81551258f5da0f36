"""Measure (issue 31): the HBM bytes torchtitan's eager RMSNorm moves per normalised element,
forward and backward, against one fused kernel's. fsdp.toml ``[options.eager_rmsnorm]`` reads
its two figures from this count (``costmodels/model/eager_norm.py`` prices them).

Why: torchtitan's Dec 2024 H100 benchmark (benchmarks/llama3_h100_202412_torchtitan.md, torchtitan
9dec370) ran train_configs/llama3_8b.toml, ``norm_type = "rmsnorm"``: torchtitan/models/norms.py
``RMSNorm``, plain torch, ``_norm(x.float()).type_as(x) * weight`` with ``_norm(x) = x *
rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``. Without ``training.compile`` every aten op of it
is its own CUDA kernel that reads and writes whole tensors in HBM (the fp32 copies included);
with compile (torchtitan compiles each TransformerBlock) inductor fuses it into one kernel, as
the Triton ``fused_rmsnorm`` of the April 2024 A100 runs' 8B / 13B configs is one kernel. The
formula below restates those three lines (so the count runs without torchtitan's Triton import).

How: a TorchDispatchMode sees every aten op of the forward and of ``backward()`` (the autograd
formulas are the same aten ops on CUDA); each op that does not return a view of its input
(``_is_view``-style aliasing: view, detach, expand) moves its inputs' and outputs' bytes once.
The fused reference is what one kernel must move: forward reads x and writes y (2 + 2 bytes
in bf16), backward reads x and dy and writes dx (2 + 2 + 2), the weight and the per-row rstd
being < 0.1 % at h = 4096. The figures do not depend on h or the token count (all per element).

    python benchmarks/measure_eager_rmsnorm_bytes.py
    # measured 2026-11-28, torch 2.13.0 CPU, h = 4096, 64 rows, bf16:
    #   eager forward  36.0 bytes/element (_to_copy 6, pow 8, mean 4, mul 8, _to_copy 6, mul 4)
    #   eager backward 96.1 bytes/element (16 ops)
    #   fused          4 forward, 6 backward  ->  beyond a fused norm: 32.0 forward, 90.1 backward
"""
from __future__ import annotations

import sys

H, ROWS = 4096, 64
FUSED_FWD, FUSED_BWD = 4.0, 6.0   # bf16: read x, write y / read x and dy, write dx (docstring)


def count(fn) -> list[tuple[str, int]]:
    """(op, bytes moved) for every aten op ``fn()`` runs that is not a view of its input."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def tensors(x):
        return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]

    class Bytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins, outs = tensors((args, kwargs)), tensors(out)
            inputs = {t.untyped_storage().data_ptr() for t in ins}
            if not any(o.untyped_storage().data_ptr() in inputs for o in outs):   # a view moves nothing
                self.ops.append((str(func).replace("aten.", ""),
                                 sum(t.numel() * t.element_size() for t in ins + outs)))
            return out

    with Bytes() as mode:
        fn()
    return mode.ops


def measure(h: int = H, rows: int = ROWS) -> dict:
    import torch

    def rmsnorm(x, w, eps=1e-6):   # torchtitan 9dec370 torchtitan/models/norms.py RMSNorm (docstring)
        def _norm(x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return _norm(x.float()).type_as(x) * w

    x = torch.randn(rows, h, dtype=torch.bfloat16, requires_grad=True)
    w = torch.nn.Parameter(torch.ones(h, dtype=torch.bfloat16))
    out = {}
    fwd = count(lambda: out.setdefault("y", rmsnorm(x, w)))
    g = torch.randn(rows, h, dtype=torch.bfloat16)
    bwd = count(lambda: out["y"].backward(g))
    n = rows * h
    return {"fwd_ops": fwd, "bwd_ops": bwd, "fwd": sum(b for _, b in fwd) / n, "bwd": sum(b for _, b in bwd) / n}


def main() -> int:
    import torch
    m = measure()
    print(f"torch {torch.__version__}, h = {H}, {ROWS} rows, bf16: bytes moved per normalised element")
    for name in ("fwd", "bwd"):
        ops = ", ".join(f"{op} {b / (H * ROWS):.1f}" for op, b in m[name + "_ops"])
        print(f"  eager {name}: {m[name]:.1f}  ({ops})")
    print(f"  fused kernel: {FUSED_FWD:.0f} forward, {FUSED_BWD:.0f} backward")
    print(f"  beyond a fused norm: {m['fwd'] - FUSED_FWD:.1f} forward, {m['bwd'] - FUSED_BWD:.1f} backward "
          "(fsdp.toml [options.eager_rmsnorm])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
