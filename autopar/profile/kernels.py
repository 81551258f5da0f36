"""What ``autopar profile`` measures besides matmuls, copies and collectives: the rates of the
kernels a training step spends the rest of its time in (runs inside the spawned ranks).

Each answers one question the cost model asks (``costmodels.model.compute`` / ``estimate``):

* **element-wise bandwidth** — layer norm, GeLU, residual add, fp32 cast and log-softmax,
  forward and backward through autograd, on ``2**20``-element bf16 activations on a CPU (the size
  of a transformer block's activations per micro-batch on a small host; large enough to leave the
  per-op dispatch cost behind) and ``2**26`` on a GPU (where 2**20 is launch-bound). Bytes moved
  are *counted*, not assumed: a ``TorchDispatchMode``
  sums the bytes of every aten op's tensor arguments and results over one call; the rate is
  those bytes over the call's time. On a GPU this is close to HBM bandwidth; on a CPU these
  kernels run far below ``copy_`` bandwidth (exp, erf and reductions are compute-bound there).
* **attention efficiency** — ``scaled_dot_product_attention`` (causal, bf16) forward +
  backward at ``B·H = 8`` heads of 64, ``S`` = 256 and 512 on a CPU (``B·H = 32`` heads of 128,
  ``S`` = 2048 and 4096 on a GPU), with the FLOPs the cost model counts
  for the attention core (``4·B·S²·H·D`` forward, twice that backward); the mean rate over the
  two sizes, as a fraction of this rank's bf16 matmul peak (done in ``build_profile``).
* **cross-entropy rate** — logits per second of ``F.cross_entropy(logits.float(), targets)``
  forward + backward on bf16 logits (vocabulary 8192; 2^19 .. 2^25 logits on a CPU, 2^21 ..
  2^27 on a GPU), autopar's token loss, as a curve over the logits per call: on a CPU exp and
  log make it compute-bound, and it runs ~3x slower once the fp32 logits leave the caches.
* **optimizer bandwidth** — ``torch.optim.AdamW(lr=1e-4)``, as ``autopar validate`` and the
  examples build it, stepping fp32 tensors of 4 × ``2**21`` + 16 × ``2**16`` parameters (a few
  large weights and many small ones: on a CPU the rate depends on the tensor sizes through the
  caches and the temporaries' page faults by a factor of 2–3); the rate counts
  ``OPTIMIZER_BYTES_PER_PARAM`` bytes per parameter, the figure the cost model divides by it.
* **comm overlap** — does a data-parallel all-reduce hide behind compute? The time of a loop of
  matmuls alone (``T_c``), of all-reduces alone (``T_a``, sized to take about as long), and of
  both at once (all-reduces issued ``async_op=True`` before the matmuls, waited after):
  ``overlap = (T_c + T_a − T_both) / min(T_c, T_a)``, clipped to [0, 1]. 1 = fully hidden
  (separate NCCL streams), 0 = serialised; gloo on this 2-core VM measures 0.15–0.5.
* **in-step collective time** — what one collective costs *between compute*, as a step issues
  it (a TP all-reduce after a layer's matmuls), not back to back as nccl-tests time it. Pairs
  of timed runs of ``R`` iterations: compute alone (matmuls of about 5 ms on a CPU), then
  compute followed by the collective; its in-step time is the difference per iteration (slowest
  rank, median of 5 pairs, the order within a pair alternating), at least its back-to-back time. On a
  2-core host running gloo this is 2–4× the back-to-back time: every call wakes the ranks' communication
  threads and waits out the ranks' drift in compute, both of which a tight loop hides. ``all_gather_into_tensor``
  is timed here as FSDP2 (ZeRO-2/3) issues it: ``unshard()`` + ``reshard()`` of a
  ``fully_shard``-ed module holding ``S`` bytes of fp32 parameters (copy-in, all-gather, copy-out
  into fresh unsharded parameters, Python hooks), about twice the bare collective on a CPU;
  ``reduce_scatter_tensor`` as FSDP2's gradient sync: a backward of that module with
  ``set_requires_gradient_sync(True)`` against the same backward without.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autopar.profile.measure import agreed_int, best_time, synchronize


def _best(fn, device, min_time_s: float, cpu_clock: bool) -> float:
    """Best-of-5 seconds per call (``measure.best_time``), by this thread's CPU time with ``cpu_clock``."""
    wall, cpu = best_time(fn, device, min_time_s)
    return cpu if cpu_clock else wall


def counted_bytes(fn) -> int:
    """Bytes of the tensor arguments and results of every aten op ``fn`` runs (one call)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            flat, _ = tree_flatten((args, kwargs, out))
            seen = set()
            for t in flat:
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    _Count.total += t.numel() * t.element_size()
            return out

    with _Count():
        fn()
    return _Count.total


def elementwise_mix(device, numel: int | None = None, hidden: int = 1024):
    """The element-wise kernels of a transformer step (forward and backward), as one call.
    ``2**20`` elements on a CPU; ``2**26`` on a GPU, where ``2**20`` (2 MiB) is launch-bound: a
    1×H100 measured 0.30 TB/s there, a tenth of its copy rate."""
    if numel is None:
        numel = (1 << 26) if device.type == "cuda" else (1 << 20)
    x = torch.randn(numel // hidden, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(numel // hidden, hidden, device=device)

    def fn():
        y = F.layer_norm(x, (hidden,), w)
        z = F.gelu(y, approximate="tanh") + x
        out = torch.log_softmax(z.float(), dim=-1)
        out.backward(g)
        x.grad = w.grad = None
    return fn


def elementwise_rate(device, min_time_s: float, cpu_clock: bool) -> dict:
    fn = elementwise_mix(device)
    nbytes = counted_bytes(fn)
    t = _best(fn, device, min_time_s, cpu_clock)
    return {"bytes": nbytes, "seconds": t, "bytes_per_s": nbytes / t}


def attention_rate(device, min_time_s: float, cpu_clock: bool) -> dict:
    """Causal SDPA forward + backward; the FLOPs the cost model counts (``12·B·S²·H·D``) per
    second. A CPU: B·H = 2·4 heads of 64 at S = 256, 512. A GPU: 2·16 heads of 128 at S = 2048,
    4096, the shapes of the models it trains (at the CPU's shapes a 1×H100 measured 0.9 % of its
    peak, all kernel launches, which priced gpt2-medium 7× too slow)."""
    b, h, d, seqs = (2, 16, 128, (2048, 4096)) if device.type == "cuda" else (2, 4, 64, (256, 512))
    rows = []
    for s in seqs:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        go = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16)

        def fn(q=q, k=k, v=v, go=go):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)
            q.grad = k.grad = v.grad = None
        flops = 12.0 * b * s * s * h * d
        t = _best(fn, device, min_time_s, cpu_clock)
        rows.append([s, flops, flops / t])
    return {"rows": rows, "flops_per_s": sum(r[2] for r in rows) / len(rows)}


def cross_entropy_rate(device, min_time_s: float, cpu_clock: bool, vocab: int = 8192) -> dict:
    """Logits per second of autopar's token loss (``F.cross_entropy(logits.float(), targets)``,
    forward and backward from bf16 logits) at several sizes: the rate falls by ~3x once the fp32
    logits leave the caches, so the cost model reads it as a curve over logits per call."""
    sizes = [1 << 21, 1 << 23, 1 << 25, 1 << 27] if device.type == "cuda" else \
        [1 << 19, 1 << 21, 1 << 23, 1 << 25]
    rows = []
    for n in sizes:
        logits = torch.randn(n // vocab, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.randint(0, vocab, (n // vocab,), device=device)

        def fn(logits=logits, targets=targets):
            F.cross_entropy(logits.float(), targets).backward()
            logits.grad = None
        t = _best(fn, device, min_time_s, cpu_clock)
        rows.append([n, n / t])
        del logits, targets
    return {"vocab": vocab, "rows": rows}


def optimizer_rate(device, min_time_s: float, cpu_clock: bool, bytes_per_param: float) -> dict:
    sizes = [1 << 21] * 4 + [1 << 16] * 16      # a few large weights and many small ones
    params = [torch.nn.Parameter(torch.randn(n, device=device)) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4)
    n = sum(p.numel() for p in params)
    t = _best(opt.step, device, min_time_s, cpu_clock)
    return {"params": n, "seconds": t, "bytes_per_s": bytes_per_param * n / t}


def comm_overlap(device, nbytes: int = 8 << 20) -> dict:
    """Overlap of all-reduces with matmuls (module docstring); every rank runs the same calls."""
    buf = torch.ones(nbytes // 4, device=device)
    a = torch.randn(384, 384, device=device, dtype=torch.bfloat16)

    def comm(reps):
        for _ in range(reps):
            dist.all_reduce(buf)
        synchronize(device)

    def compute(reps):
        for _ in range(reps):
            torch.mm(a, a)
        synchronize(device)

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        return float(el.item())

    comm(1)
    compute(2)
    n_comm = 4
    t_comm = min(timed(lambda: comm(n_comm)) for _ in range(2))
    one_mm = min(timed(lambda: compute(20)) for _ in range(3)) / 20
    n_mm = agreed_int(max(1, int(t_comm / max(one_mm, 1e-7))), device)

    def both():
        works = [dist.all_reduce(buf, async_op=True) for _ in range(n_comm)]
        compute(n_mm)
        for w in works:
            w.wait()
        synchronize(device)
    # paired repeats (alone, alone, both), the median pair's overlap: the best of each apart
    # mixed lucky and unlucky runs (0.0 to 0.53 from one profile to the next on a 2-core VM)
    pairs = []
    for _ in range(5):
        tc, tm, tb = timed(lambda: comm(n_comm)), timed(lambda: compute(n_mm)), timed(both)
        pairs.append(((tm + tc - tb) / max(min(tm, tc), 1e-9), tc, tm, tb))
    frac, t_comm, t_mm, t_both = sorted(pairs)[len(pairs) // 2]
    return {"compute_s": t_mm, "comm_s": t_comm, "both_s": t_both, "bytes": nbytes,
            "all_reduces": n_comm, "overlap": min(1.0, max(0.0, frac))}


def in_step_time(fn, device, floor_s: float, compute_s: float | None = None, reps: int = 8,
                 pairs: int = 5, base=None) -> float:
    """Seconds one call of the collective ``fn`` adds to a loop of compute (module docstring);
    ``floor_s`` is its back-to-back time. Every rank must call this with the same arguments.
    ``compute_s``: the compute between two calls; by default 5 ms on a CPU (a block's matmuls on
    one core: the longer the gap, the deeper the ranks' threads sleep — 1-2 ms gaps measured
    about half the extra of 5-10 ms gaps on a 2-vCPU VM) and 1 ms on a GPU.
    ``base``: work both loops do after the compute, so that only ``fn``'s excess over it counts
    (FSDP2's reduce-scatter: a backward with gradient sync against one without).
    """
    if compute_s is None:
        compute_s = 1e-3 if device.type == "cuda" else 5e-3
    a = torch.randn(256, 256, device=device)

    def compute(k):
        for _ in range(k):
            torch.mm(a, a)

    compute(2)
    synchronize(device)
    t0 = time.perf_counter()
    compute(20)
    synchronize(device)
    one = max((time.perf_counter() - t0) / 20, 1e-7)
    k = agreed_int(max(1, int(compute_s / one)), device)
    fn()
    if base is not None:
        base()

    def run(with_comm: bool) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            compute(k)
            if with_comm:
                fn()
            elif base is not None:
                base()
        synchronize(device)
        return time.perf_counter() - t0

    times = []
    for i in range(pairs):   # alternate which loop goes first, so drift favours neither
        if i % 2 == 0:
            without = run(False)
            with_ = run(True)
        else:
            with_ = run(True)
            without = run(False)
        times.append([without, with_])
    el = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    extra = ((el[:, 1] - el[:, 0]) / reps).median().item()
    return max(float(extra), floor_s)


def _fsdp_module(nbytes: int, device, n: int):
    """Four bias-free linears holding ``nbytes`` of fp32 parameters in all, ``fully_shard``-ed
    over the world (kept through backward), and an input of one row: a forward and backward
    that cost next to nothing but FSDP2's own work."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    width = 256
    rows = max(n, nbytes // 4 // width // 4)
    m = _FanOut([torch.nn.Linear(width, rows, bias=False, device=device) for _ in range(4)])
    fully_shard(m, mesh=init_device_mesh(device.type, (n,)), reshard_after_forward=False)
    return m, torch.randn(1, width, device=device)


class _FanOut(torch.nn.Module):
    """The sum of several linears' outputs on one input (a scalar to backward from)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x):
        return sum(lin(x).sum() for lin in self.layers)


def fsdp_unshard_fn(nbytes: int, device, n: int):
    """One FSDP2 parameter all-gather of ``nbytes`` (whole, fp32) and its reshard, over the
    world: the all-gather a ZeRO-3 step pays before each block's forward and backward."""
    m, _ = _fsdp_module(nbytes, device, n)

    def fn():
        m.unshard()
        m.reshard()
    return fn


def fsdp_reduce_fns(nbytes: int, device, n: int):
    """(with, without) FSDP2's gradient reduce-scatter of ``nbytes`` (whole, fp32): a forward +
    backward of the module with gradient sync, and the same without it; the difference is
    what the gradient sync of ZeRO-2/3 costs (copy-in, reduce-scatter, sharded gradients)."""
    m, x = _fsdp_module(nbytes, device, n)

    def step(sync: bool):
        m.set_requires_gradient_sync(sync)
        m(x).backward()
        m.zero_grad(set_to_none=True)
    return (lambda: step(True)), (lambda: step(False))
