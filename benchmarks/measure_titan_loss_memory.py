"""What torchtitan's loss holds, measured on this machine's torch (CPU; the figures of
runtime-profiles/fsdp.toml's ``loss_*_bytes_per_logit``, costmodels/model/loss_backward_memory.py):

* eager ``F.cross_entropy(pred.float(), labels)``: what its forward saves, and how far its backward
  peaks above what the forward left held (every storage an aten op makes, tracked live);
* the same under ``torch.compile`` (torchtitan from bbb1b616e, ``fsdp:compiled_loss``): what the
  compiled forward saves for its backward (autograd's saved-tensor hooks see the partition);
* under ``loss_parallel()`` on a 1-rank gloo mesh (torchtitan at tp > 1): the backward's peak above
  the forward's hold, DTensor's handler temporaries included.

    python benchmarks/measure_titan_loss_memory.py     # 12 s on a loaded 2-core machine

Output (torch 2.13 CPU): eager saves two views of one (tokens, vocab) fp32 log-softmax, its backward
peaks 8.0 B/logit above the forward's hold; compiled saves the bf16 input and two (tokens, 1) fp32
statistics; loss_parallel's backward peaks 12.0 B/logit above the forward's hold.
"""
from __future__ import annotations

import os
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

N, V = 256, 8192   # tokens, vocabulary
LOGITS = N * V


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages aten ops made that are still alive, and their peak."""

    def __init__(self):
        super().__init__()
        self.live, self.cur, self.peak = {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            t = t._local_tensor if isinstance(t, DTensor) else t
            if isinstance(t, torch.Tensor) and type(t) is torch.Tensor:
                s = t.untyped_storage()
                if s.data_ptr() and s.data_ptr() not in self.live:
                    self.live[s.data_ptr()] = s.nbytes()
                    self.cur += s.nbytes()
                    weakref.finalize(s, self._free, s.data_ptr())
        self.peak = max(self.peak, self.cur)
        return out

    def _free(self, key):
        self.cur -= self.live.pop(key, 0)


def loss_fn(pred, labels):   # torchtitan's cross_entropy_loss
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def inputs():
    return (torch.randn(1, N, V, dtype=torch.bfloat16, requires_grad=True), torch.randint(0, V, (1, N)))


def backward_above_forward(run_forward) -> tuple[float, float]:
    """(bytes a logit held after the forward, bytes a logit the backward peaks above that)."""
    m = LiveBytes()
    with m:
        loss = run_forward()
        held = m.cur
        m.peak = m.cur
        loss.backward()
    return held / LOGITS, (m.peak - held) / LOGITS


def saved_by(fn) -> list[tuple[tuple[int, ...], torch.dtype, bool]]:
    pred, labels = inputs()
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype, t.untyped_storage().data_ptr() == pred.untyped_storage().data_ptr()))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(pred, labels)
    loss.backward()
    return saved


def main() -> int:
    print("eager F.cross_entropy saves:", saved_by(loss_fn))
    print("compiled F.cross_entropy saves (shape, dtype, is the bf16 input):", saved_by(torch.compile(loss_fn)))
    pred, labels = inputs()
    held, above = backward_above_forward(lambda: loss_fn(pred, labels))
    print(f"eager: {held:.1f} B/logit held after the forward (the bf16 logits included), backward peaks "
          f"{above:.1f} B/logit above it")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        import torch.distributed.tensor.parallel.loss as lp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.tensor.parallel import loss_parallel
        mesh = init_device_mesh("cpu", (1,))
        pred, labels = inputs()
        handler = lp._nll_loss_and_log_softmax_backward
        outer: list[LiveBytes] = []

        def traced(*a, **k):   # DTensor runs the handler's local ops beneath the outer mode
            with LiveBytes() as inner:
                inner.cur = inner.peak = outer[0].cur
                r = handler(*a, **k)
            outer[0].peak = max(outer[0].peak, inner.peak)
            return r
        lp._nll_loss_and_log_softmax_backward = traced
        m = LiveBytes()
        outer.append(m)
        with m, loss_parallel():
            loss = loss_fn(distribute_tensor(pred, mesh, [Shard(-1)]), labels)
            held = m.cur
            m.peak = m.cur
            loss.backward()
        lp._nll_loss_and_log_softmax_backward = handler
        print(f"loss_parallel: {held / LOGITS:.1f} B/logit held after the forward, backward peaks "
              f"{(m.peak - held) / LOGITS:.1f} B/logit above it")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
