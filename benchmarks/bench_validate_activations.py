"""Saved activations per layer-table row: the trace's prediction against what autograd really
saves when the model trains the way ``autopar validate`` runs it (CPU, torch.autocast bf16, flash
attention), one micro-batch of ONE sequence, single process.

    python benchmarks/bench_validate_activations.py [MODEL] [--attention flash|math]

Prints, per row, the table's ``saved_activation_bytes`` (minus ``act_attention_core_bytes`` for
flash, as costmodels.model.memory does) and the bytes of the distinct tensors autograd saved while the
row ran (parameters excluded), by dtype; the loss (cross-entropy) is its own line: the table has
no row for it.
"""
from __future__ import annotations

import argparse
import collections

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256")
    ap.add_argument("--attention", default="flash", choices=["flash", "math"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    from autopar.models import load_model
    from autopar.trace import table_for
    src = load_model(args.model)
    table = table_for(args.model, micro_batch=1)
    model = src.build("cpu", seed=0, attention=args.attention)
    x, y = src.make_batch(1, seed=0)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set = set()
    saved: collections.Counter = collections.Counter()
    cur = ["?"]

    def pack(t):
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes())
        if st.data_ptr() not in params and key not in seen:
            seen.add(key)
            saved[(cur[0], str(t.dtype).replace("torch.", ""))] += st.nbytes()
        return t

    rows = [("embedding", model.embedding)] + [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)] \
        + [("head", model.head)]
    for name, mod in rows:
        mod.register_forward_pre_hook(lambda m, a, n=name: cur.__setitem__(0, n))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(*x)
        cur[0] = "loss"
        src.loss(out, y)
    mib = 2 ** 20
    print(f"{args.model}, attention={args.attention}, torch.autocast bf16, one sequence")
    print(f"{'row':<12}{'predicted MiB':>15}{'saved MiB':>12}   by dtype")
    tp = ts = 0.0
    for (name, _), r in zip(rows + [("loss", None)], list(table.rows) + [None]):
        core = r.act_attention_core_bytes if r is not None and args.attention == "flash" else 0
        pred = 0.0 if r is None else r.saved_activation_bytes - core
        got = {d: v for (n, d), v in saved.items() if n == name}
        tot = sum(got.values())
        tp, ts = tp + pred, ts + tot
        print(f"{name:<12}{pred / mib:>15.2f}{tot / mib:>12.2f}   " + ", ".join(f"{d} {v / mib:.2f}" for d,
                                                                                v in sorted(got.items())))
    print(f"{'total':<12}{tp / mib:>15.2f}{ts / mib:>12.2f}   ratio {ts / tp:.2f}")


if __name__ == "__main__":
    main()
