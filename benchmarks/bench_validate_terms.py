"""Where a CPU training step's time goes, by the cost model's terms.

    python benchmarks/bench_validate_terms.py [MODEL] [--batch B] [--hardware PROFILE]

One process, one thread, the way a ``autopar validate`` rank runs a dp plan's step (AdamW,
torch.autocast bf16, flash attention, ``B`` sequences in one micro-batch). torch.profiler's
self CPU time per op is summed by category and set beside the cost model's term for the same work
on ``PROFILE`` (costmodels.model.compute.row_times / optimizer_step_s for one GPU, tp=1):

    matmul      aten::mm / addmm / bmm / linear         <-> Σ FLOPs / (P · eff)   (attention excluded)
    attention   aten::_scaled_dot_product_*             <-> 4·b·s²·h·(1+2) / (P · attention_efficiency)
    optimizer   everything under Optimizer.step         <-> optimizer_step_s (measured AdamW rate)
    loss        log_softmax / nll_loss (fwd + bwd)      <-> logits / the profile's cross-entropy rate
    casts       aten::copy_ / _to_copy (autocast)        <-> autocast_step_s (weight + grad casts)
    other       every other op (layer norm, gelu, add,  <-> C_FWD/C_BWD · saved bytes / element-wise W
                dropout, embedding, fill, ...)
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--hardware", default="cpu-2core")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from autopar.models import load_model
    from autopar.trace import table_for
    from costmodels.model.compute import ATTN_BWD_RATIO, C_BWD, C_FWD, LOSS_BYTES_PER_LOGIT, row_times
    from costmodels.model.optimizer import autocast_step_s, optimizer_step_s
    from costmodels.model.table_arrays import activation_bytes_none, table_arrays
    from costmodels.profiles.hardware_files import load_profile
    src = load_model(args.model)
    model = src.build("cpu", seed=0, attention="flash")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = src.make_batch(args.batch, seed=0)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = src.loss(model(*x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    c0 = time.process_time()
    for _ in range(3):
        step()
    cpu_step = (time.process_time() - c0) / 3
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    cats = {"matmul": 0.0, "attention": 0.0, "optimizer": 0.0, "loss": 0.0, "casts": 0.0, "other": 0.0}
    opt_total = 0.0
    for e in prof.key_averages():
        name, t = e.key, e.self_cpu_time_total / 1e6
        if name.startswith("Optimizer.step"):
            opt_total = e.cpu_time_total / 1e6
    for e in prof.key_averages():
        name, t = e.key, e.self_cpu_time_total / 1e6
        if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul"):
            cats["matmul"] += t
        elif "scaled_dot_product" in name:
            cats["attention"] += t
        elif "log_softmax" in name or "nll_loss" in name:
            cats["loss"] += t
        elif name in ("aten::copy_", "aten::_to_copy"):
            cats["casts"] += t
        elif not name.startswith("Optimizer.step"):
            cats["other"] += t
    # the optimizer's elementwise ops (sqrt, div, lerp, addcdiv, ...) landed in 'other'/'casts'
    cats["other"] -= opt_total
    cats["optimizer"] = opt_total
    total = sum(cats.values())

    prof_ = load_profile(args.hardware)
    table = table_for(args.model, micro_batch=1)
    rt = row_times(table, prof_, 1, False, args.batch, "none", "flash")
    arr = table_arrays(table)
    peak = prof_.peak_flops_per_s(2)
    k = args.batch
    # attention core: fwd + bwd (2x) at the profile's attention efficiency (else the row's)
    att_f = float(arr.attn_core_flops.sum()) * k * (1 + ATTN_BWD_RATIO)
    att_eff = prof_.attention_efficiency or float(prof_.matmul_efficiency(float(arr.attn_core_flops.max()) * k))
    att_pred = att_f / (peak * att_eff)
    act = activation_bytes_none(arr, 1, False, args.batch, "flash")
    mem_pred = float(((C_FWD + C_BWD) * act).sum()) / prof_.elementwise_bw
    logits = float(arr.loss_logits.sum()) * k
    if prof_.ce_logits:
        loss_pred = logits / float(prof_.cross_entropy_logits_per_s(logits))
    else:
        loss_pred = logits * LOSS_BYTES_PER_LOGIT / prof_.elementwise_bw
    comp_pred = float(rt.fwd_s.sum() + rt.bwd_s.sum())
    mm_pred = comp_pred - mem_pred - att_pred - loss_pred
    params = float(arr.params.sum())
    pred = {"matmul": mm_pred, "attention": att_pred, "optimizer": optimizer_step_s(params, prof_),
            "loss": loss_pred, "casts": autocast_step_s(params, 1, "amp", prof_), "other": mem_pred}
    print(f"{args.model}, batch {args.batch}, 1 thread, AdamW, autocast bf16, flash; profile {prof_.name}")
    print(f"step CPU time {cpu_step:.3f} s (profiled step {total:.3f} s); cost model {sum(pred.values()):.3f} s")
    print("measured s = the category's share of the profiled step x the step's CPU time (the profiler's")
    print("own times are wall durations, inflated by its overhead and by other load on the host)")
    print(f"{'term':<11}{'measured s':>11}{'share':>7}{'predicted s':>13}{'measured/predicted':>20}")
    for c in cats:
        m = cats[c] / total * cpu_step
        r = f"{m / pred[c]:.2f}" if pred[c] > 0 else "no term"
        print(f"{c:<11}{m:>11.3f}{cats[c] / total:>7.0%}{pred[c]:>13.3f}{r:>20}")


if __name__ == "__main__":
    main()
