"""What ``autopar train`` logs beside the loss: tokens/s per GPU, MFU against a hardware profile,
peak memory, and the plan's predicted step time (``costmodels`` estimate) beside the measured one.

MFU counts the FLOPs the cost model counts (the layer table's forward + backward FLOPs of the
global batch, recompute left out: model FLOPs, not hardware FLOPs) over the profile's dense peak
for the step's dtype (bf16 under autocast on CUDA, fp32 on CPU) — the estimate's own ``mfu``
definition, so the predicted and measured columns compare like for like.
"""
from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch


@dataclass
class Yardstick:
    """The per-step figures the measured time is compared with (None: not known)."""

    flops_per_step: float | None = None      # model FLOPs of one global batch, all ranks
    peak_flops_per_gpu: float | None = None  # the profile's dense peak for the step's dtype
    predicted_step_s: float | None = None    # costmodels estimate of the plan
    note: str = ""                           # why a figure is missing

    def mfu(self, step_s: float, gpus: int) -> float | None:
        if not self.flops_per_step or not self.peak_flops_per_gpu or step_s <= 0:
            return None
        return self.flops_per_step / (gpus * self.peak_flops_per_gpu * step_s)


def yardstick(spec: str, seq, plan, global_batch: int, hardware: str | None, cuda: bool,
              compiled: bool) -> Yardstick:
    """The layer table's FLOPs and, with ``hardware``, its peak and the estimate of ``plan``
    (priced on runtime ``autopar:compile`` when ``compiled``). Anything the cost model refuses
    leaves that figure out, with the reason in ``note``."""
    from autopar.trace import table_for
    from costmodels.contracts.errors import AutoparError
    try:
        table = table_for(spec, micro_batch=plan.micro_batch_size, seq=seq)
    except Exception as e:  # noqa: BLE001 — a figure of the log must never stop the training
        return Yardstick(note=f"no layer table ({type(e).__name__}): no MFU or prediction")
    flops = sum(r.fwd_flops + r.bwd_flops for r in table.rows) * global_batch / table.micro_batch
    out = Yardstick(flops_per_step=flops)
    if hardware is None:
        out.note = "MFU and predicted step time need --hardware"
        return out
    from costmodels.model.estimate import estimate
    from costmodels.profiles.hardware_files import load_profile
    profile = load_profile(hardware)
    out.peak_flops_per_gpu = profile.peak_flops_per_s(2 if cuda else 4)
    priced = plan
    if compiled and plan.runtime in (None, "autopar"):
        priced = plan.with_(runtime="autopar:compile")
    try:
        est = estimate(table, profile, priced, plan.world_size, global_batch,
                       precision="bf16-mixed" if cuda else "fp32")
        out.predicted_step_s = est.step_time_s
    except AutoparError as e:
        out.note = f"no prediction: {e}"
    except Exception as e:  # noqa: BLE001 — as above
        out.note = f"no prediction ({type(e).__name__})"
    return out


def peak_memory_bytes(device: torch.device) -> int:
    """Peak bytes of this rank: the CUDA caching allocator's peak, or on CPU the process's peak
    resident set (ru_maxrss: KiB on Linux, bytes on macOS)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def log_line(step: int, loss: float, step_s: float, tokens_per_step: int, gpus: int,
             mem_bytes: int, ys: Yardstick, lr: float, grad_norm: float | None) -> str:
    """``step 12 loss 2.98413 lr 3.0e-04 | 0.412 s (pred 0.398 s) | 9,941 tok/s/gpu | MFU 41.2 % | mem 12.3 GB``"""
    parts = [f"step {step:5d} loss {loss:.5f}", f"lr {lr:.2e}"]
    if grad_norm is not None:
        parts.append(f"gnorm {grad_norm:.3f}")
    timing = f"{step_s * 1e3:.1f} ms"
    if ys.predicted_step_s is not None:
        timing += f" (pred {ys.predicted_step_s * 1e3:.1f} ms)"
    parts.append(timing)
    parts.append(f"{tokens_per_step / step_s / gpus:,.0f} tok/s/gpu")
    mfu = ys.mfu(step_s, gpus)
    if mfu is not None:
        parts.append(f"MFU {100 * mfu:.1f} %")
    parts.append(f"mem {mem_bytes / 1e9:.2f} GB")
    return " | ".join(parts)
