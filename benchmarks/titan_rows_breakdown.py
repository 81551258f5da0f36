"""The torchtitan open rows term by term (issue 31): published against predicted step time, and
what the prediction is made of — GEMMs, the attention core, the element-wise kernels, the eager
RMSNorm's extra kernels (``fsdp:eager_rmsnorm``, costmodels/model/eager_norm.py), the loss,
recompute, exposed ZeRO traffic — per step on the busiest GPU, for each of a row's plans (a
partial recompute policy is the mean of its no-recompute and full-recompute plans,
``costmodels.calibration.open_runs``).

    python benchmarks/titan_rows_breakdown.py [h100|a100]
    # 2026-11-28 (tth100 branch), the H100 8-GPU eager row: published 2.843 s, predicted 2.763 s
    # (-2.8 %; -9.2 % before the eager norm): GEMM 0.376 + 0.752, attention 0.203 + 0.508,
    # element-wise 0.093 + 0.185, eager norm 0.159, loss 0.028 (forward + backward); recompute
    # 0.593 on the full plan (0.552 + the norms' 0.041; half of it in the row's mean), ZeRO
    # exposed 0.075; the rest of "compute" (2.392) is the optimizer step and ZeRO's HBM copies
"""
from __future__ import annotations

import sys

import numpy as np


def main(argv: list[str]) -> int:
    from autopar.trace import table_for
    from costmodels.calibration.open_runs import predict, titan_runs
    from costmodels.model import compute as C
    from costmodels.model.coefficients import plan_row_times
    from costmodels.model.table_arrays import activation_bytes_none, table_arrays
    from costmodels.profiles.hardware_files import load_profile
    from costmodels.profiles.kernel_stacks import stack_elementwise, stack_profile
    from costmodels.profiles.runtime import load_runtime
    gpu = argv[0] if argv else "h100"
    for run in titan_runs():
        if gpu not in run.hardware:
            continue
        res = predict(run, table_for)
        print(f"\n{run.label} ({run.plans[0].runtime}): published {run.published_step_s:.3f} s, "
              f"predicted {res['predicted_step_s']:.3f} s ({res['error'] * 100:+.1f} %)")
        for p, e in zip(run.plans, res["estimates"]):
            terms = ", ".join(f"{k} {v:.3f}" for k, v in e.breakdown_s.items() if v)
            print(f"  recompute={p.recompute}: step {e.step_time_s:.3f} s = {terms}")
        table, prof, plan = table_for(run.spec), load_profile(run.hardware), run.plans[0]
        rt = load_runtime(plan.runtime)
        kp, arr = stack_profile(prof, rt.kernel_stack), table_arrays(table)
        k, m = plan.micro_batch_size / table.micro_batch, plan.num_micro_batches(run.global_batch)
        peak = kp.peak_flops_per_s(table.act_dtype_bytes)
        eff = C.row_matmul_efficiency(arr, kp, k, 1)
        fa = k * arr.attn_core_flops

        def step(x, m=m):   # seconds per step: m micro-batches of the per-micro-batch rows
            return m * float(np.sum(x))
        gemm_f = step(k * arr.fwd_flops / (peak * eff)) - step(fa / (peak * eff))
        gemm_b = step(k * arr.bwd_flops / (peak * eff)) - 2 * step(fa / (peak * eff))
        attn_f = step(fa / (peak * kp.attention_efficiency))
        attn_b = attn_f * (kp.attention_bwd_ratio or C.FLASH_BWD_RATIO)
        ew = step((stack_elementwise(kp, rt) or C.C_FWD) * activation_bytes_none(
            arr, 1, False, plan.micro_batch_size, plan.attention) / kp.elementwise_bw)
        loss = step(k * arr.loss_logits * C.LOSS_BYTES_PER_LOGIT / kp.elementwise_bw)
        plain = plan_row_times(arr, prof, plan.with_(runtime="fsdp"), "bf16-mixed", load_runtime("fsdp"))
        mine = plan_row_times(arr, prof, plan, "bf16-mixed", rt)
        norm = max(0.0, step(mine.fwd_s + mine.bwd_s - plain.fwd_s - plain.bwd_s))
        print(f"  per step (forward + backward): GEMM {gemm_f:.3f} + {gemm_b:.3f}, attention "
              f"{attn_f:.3f} + {attn_b:.3f}, element-wise {ew:.3f} + {2 * ew:.3f}, eager norm {norm:.3f}, "
              f"loss {loss:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
