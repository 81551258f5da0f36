"""What each rank holds when a model is applied from ``meta``: its share plus at most one row.

    python benchmarks/bench_runtime_memory.py [--model SPEC] [--json OUT]

Applies an 8-block gpt (default: gpt2-small's width, 8 blocks, 32k vocabulary, ~84 M
parameters, ~335 MB in fp32) built on ``meta`` (``source.build_meta()``, ``apply(seed=0)``)
on 4 gloo ranks under pp2·tp2 and under dp2·ZeRO-3·pp2, and prints per rank:

* ``params``: bytes of its materialised parameters after apply (``runner.parameter_bytes()``;
  tensor-parallel shards, FSDP2 shards, tied tensors once);
* ``peak params``: the most parameter bytes it held while building (its finished rows plus
  the one row in flight, ``runner.materialized``);
* ``bound``: its share (``params``) plus the largest row of the model — the target;
* ``peak RSS growth``: the process's resident-set high-water mark during apply minus its RSS
  before (``/proc/self/status`` VmHWM after resetting it via ``clear_refs``), which also counts
  the allocator's slack and torch's own buffers;

next to the serial model's parameter bytes and the RSS growth of building it on the CPU in
one process (what every rank paid before: the whole model first). Exits 1 when a rank's peak
parameters exceed its bound. tests/test_runtime_scale.py asserts the parameter bytes (not RSS)
on a small model.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT = "gpt:layers=8,hidden=768,heads=12,vocab=32000,seq=128,dropout=0,tied=true"
PLANS = {"pp2·tp2": dict(pp=2, tp=2), "dp2·zero3·pp2": dict(dp=2, pp=2, zero=3)}


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")   # resets VmHWM to the current RSS
    except OSError:
        pass


def _rank(spec: str, plan: dict) -> dict:
    import gc

    from autopar.models import load_model
    from autopar.runtime.apply import apply
    from autopar.runtime.faults import dist as adist
    from costmodels.contracts.plan import Plan
    adist.ensure_initialized(4)
    source = load_model(spec)
    model = source.build_meta()
    gc.collect()
    _reset_peak()
    before = _status("VmRSS")
    runner = apply(model, Plan(**plan), seed=0, spec=spec)
    return {"params": runner.parameter_bytes(), "peak_params": runner.materialized["peak_param_bytes"],
            "rss_growth": _status("VmHWM") - before, "rank": runner.rank}


def _serial(spec: str) -> dict:
    import gc

    from autopar.models import load_model
    from autopar.runtime.assemble.rows import model_rows
    source = load_model(spec)
    rows = model_rows(source.build_meta())
    largest_row = max(sum(p.numel() * 4 for p in m.parameters()) for m in rows.modules)
    gc.collect()
    _reset_peak()
    before = _status("VmRSS")
    model = source.build("cpu", seed=0)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"params": params, "rss_growth": _status("VmHWM") - before, "largest_row": largest_row}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    from autopar.runtime.verify.serial import spawn
    serial = spawn(_serial, 1, args.model)[0]
    mb = 1024 * 1024
    print(f"model {args.model}")
    print(f"serial model: params {serial['params'] / mb:8.1f} MiB   RSS growth "
          f"{serial['rss_growth'] / mb:8.1f} MiB   largest row {serial['largest_row'] / mb:.1f} MiB")
    ok, out = True, {"model": args.model, "serial": serial, "plans": {}}
    for name, plan in PLANS.items():
        ranks = spawn(_rank, 4, args.model, plan)
        out["plans"][name] = ranks
        print(f"\n{name}        params   peak params      bound   peak RSS growth   (MiB)")
        for r in ranks:
            bound = r["params"] + serial["largest_row"]
            ok &= r["peak_params"] <= bound
            print(f"  rank {r['rank']}    {r['params'] / mb:8.1f}    {r['peak_params'] / mb:8.1f}   "
                  f"{bound / mb:8.1f}          {r['rss_growth'] / mb:8.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    print("\nevery rank within its share + one row" if ok else "\nA RANK EXCEEDED ITS BOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
