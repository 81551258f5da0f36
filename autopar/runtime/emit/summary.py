"""``SUMMARY.md`` of ``autopar apply --emit``: which communication runs where, in one page.

Kept apart from ``emit`` (which writes the per-rank code files) because it is pure reporting over
what the rewrite logged: per row its collectives (module, forward/backward operation, local
shapes, bytes per micro-batch), plus the data-parallel / pipeline / tied-embedding traffic the
runtime adds outside the rows.
"""
from __future__ import annotations

import os

import torch.nn as nn

from autopar.rewrite.state import collectives_of
from costmodels.contracts.plan import rank_of_stage


def collective_rows(gm: nn.Module) -> list[dict]:
    """The collectives of a rewritten row (``collectives_of``) with the local shapes and bytes
    the rewrite logged for each."""
    log = {c["name"]: c for c in (getattr(gm, "autopar_info", {}) or {}).get("collectives", [])}
    out = []
    for c in collectives_of(gm):
        bare = c["name"][4:] if c["name"].startswith("row.") else c["name"]
        info = log.get(bare, {})
        out.append({**c, "in_shape": info.get("in_shape"), "out_shape": info.get("out_shape"),
                    "bytes": info.get("bytes")})
    return out


def _human_bytes(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def summary(spec, plan, rows, stages, row_coll, files) -> str:
    """SUMMARY.md: the plan, the stage cut, the tp collectives per row (consecutive rows with the
    same collectives shown once) and the communication the runtime adds outside the rows."""
    tp, L = plan.tp, []
    L.append(f"# autopar apply --emit: `{spec}`\n")
    L.append(f"Plan: dp={plan.dp}, tp={tp}, pp={plan.pp}, vpp={plan.vpp}, micro_batch_size="
             f"{plan.micro_batch_size}, zero={plan.zero}, recompute={plan.recompute}, sequence_parallel="
             f"{str(plan.sequence_parallel).lower()}, schedule={plan.schedule}, attention={plan.attention}, "
             f"placement={plan.placement} — world size {plan.world_size}.\n")
    L.append("Each file `stage{v}_tp{r}.py` holds the fx code of virtual pipeline stage v's rows for "
             "tensor-parallel rank r; the same stage is replicated on every data-parallel rank.\n")
    L.append("## Stages\n")
    L.append("| virtual stage | pipeline rank | rows | files |")
    L.append("| --- | --- | --- | --- |")
    for v, (a, b) in enumerate(stages):
        names = rows.names[a:b]
        shown = ", ".join(names) if len(names) <= 4 else f"{names[0]} … {names[-1]} ({len(names)} rows)"
        fl = ", ".join(f"`stage{v}_tp{r}.py`" for r in range(min(tp, 4))) + (" …" if tp > 4 else "")
        L.append(f"| {v} | {rank_of_stage(plan, v)} | [{a}, {b}): {shown} | {fl} |")
    L.append("")
    L.append("## Tensor-parallel collectives inside the rows\n")
    if tp == 1:
        L.append("tp = 1: the rows run no collectives.\n")
    else:
        L.append(f"All run on the tensor-parallel group ({tp} ranks; placement `{plan.placement}`), once "
                 "per micro-batch, in forward and/or backward as listed. Shapes are local to one rank "
                 f"for one micro-batch of {plan.micro_batch_size}; bytes = the larger of input and "
                 "output (fp32 as emitted; halve for bf16).\n")
    groups: list[tuple[list[int], list[dict]]] = []
    for i in sorted(row_coll):
        sig = [(c["name"], c["module"], c["in_shape"]) for c in row_coll[i]]
        if groups and [(c["name"], c["module"], c["in_shape"]) for c in groups[-1][1]] == sig:
            groups[-1][0].append(i)
        else:
            groups.append(([i], row_coll[i]))
    totals = {"fwd": 0, "bwd": 0}
    for idx, colls in groups:
        label = rows.names[idx[0]] if len(idx) == 1 else f"{rows.names[idx[0]]} … {rows.names[idx[-1]]} (each)"
        L.append(f"### {label}\n")
        if not colls:
            L.append("No collectives (replicated).\n")
            continue
        L.append("| collective (`self.…`) | kind | forward | backward | local input → output | bytes |")
        L.append("| --- | --- | --- | --- | --- | --- |")
        for c in colls:
            shape = (f"{tuple(c['in_shape'])} → {tuple(c['out_shape'])}" if c.get("in_shape") is not None else "?")
            L.append(f"| `{c['name']}` | {c['module']} | {c['fwd']} | {c['bwd']} | {shape} | "
                     f"{_human_bytes(c.get('bytes'))} |")
            for phase in ("fwd", "bwd"):
                if c[phase] not in ("identity",):
                    totals[phase] += len(idx)
        L.append("")
    if tp > 1:
        L.append(f"Per micro-batch over the whole model: {totals['fwd']} forward and {totals['bwd']} "
                 "backward tensor-parallel collectives (recompute repeats the forward ones of "
                 "checkpointed code in backward).\n")
    L.append("## Communication the runtime adds outside the rows\n")
    if plan.dp > 1:
        z = {0: "bucketed gradient all-reduce overlapped with backward (DDP)",
             1: "gradient all-reduce; optimizer state sharded (ZeRO-1), updated parameters all-gathered",
             2: "gradient reduce-scatter (ZeRO-2, FSDP2 without resharding), parameters all-gathered",
             3: "parameters all-gathered per row in forward and backward, gradients reduce-scattered (ZeRO-3, FSDP2)"}
        L.append(f"- data parallel ({plan.dp} ranks): {z[plan.zero]}.")
    if plan.pp > 1:
        L.append(f"- pipeline ({plan.pp} ranks, schedule {plan.schedule}): send/recv of each stage's "
                 f"boundary activation per micro-batch, forward and backward"
                 + (" — shape (B, T/tp, C) under sequence parallel." if plan.sequence_parallel else "."))
        L.append("- tied embedding / head weights (if any): gradient all-reduce between the first and "
                 "last pipeline stage after backward (Megatron).")
    if plan.dp == 1 and plan.pp == 1:
        L.append("- none (dp = pp = 1).")
    L.append("")
    L.append("## Files\n")
    L += [f"- `{os.path.basename(p)}`" for p in files]
    return "\n".join(L) + "\n"
