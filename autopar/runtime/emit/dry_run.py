"""``autopar apply MODEL --plan P --emit DIR``: every rank's rewritten rows as readable Python.

The model is built on ``meta`` (no weight memory, so the largest presets emit in seconds), cut
into rows and pipeline stages by the runtime's own functions (``runtime.rows.model_rows``,
``runtime.stages.stage_ranges`` / ``row_inputs``), and each row is rewritten with ``rewrite_row`` for each
tp rank against a :class:`FakeGroup` (no process group; collectives only reshape locally).

Output:
* ``DIR/stage{v}_tp{r}.py`` — one file per (virtual pipeline stage v, tp rank r): the fx code of
  each row of that stage as a class with a ``forward`` (rows with the same code as an earlier row
  of the file become a one-line subclass), its parameters with local shapes and how each is split,
  and the collective modules it calls.
* ``DIR/SUMMARY.md`` — the plan, the stage cut, and which collectives run where (per row: module,
  forward/backward operation, local tensor shapes, bytes per micro-batch), plus the communication
  the runtime adds outside the rows (dp gradient reduction / ZeRO, pipeline send/recv, tied
  embedding).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch.nn as nn

from autopar.rewrite.collectives import FakeGroup
from autopar.rewrite.state import collectives_of
from autopar.rewrite.tp import rewrite_row
from autopar.runtime.assemble.prelaunch import check_before_launch
from autopar.runtime.assemble.stages import row_inputs
from autopar.runtime.emit.summary import collective_rows, summary
from costmodels.contracts.plan import rank_of_stage


@dataclass
class EmitResult:
    out_dir: str
    files: list[str] = field(default_factory=list)
    stages: tuple = ()
    summary_path: str = ""


def _input_shape(x) -> str:
    return "inferred by the rewrite" if x is None else str(tuple(x.shape))


def _py_name(name: str) -> str:
    return re.sub(r"\W", "_", name)


_WRAP = re.compile(r'^torch\.fx\._symbolic_trace\.wrap\("(\w+)"\)\s*$', re.M)


def _class_code(cls_name: str, gm: nn.Module, doc: list[str]) -> tuple[str, set]:
    code = gm.code
    wrapped = set(_WRAP.findall(code))
    code = _WRAP.sub("", code).strip("\n")
    body = "\n".join("    " + ln if ln.strip() else "" for ln in code.splitlines())
    doc_text = "\n".join("    " + d for d in doc)
    return f'class {cls_name}(torch.nn.Module):\n    """\n{doc_text}\n    """\n\n{body}\n', wrapped


def _shape(t) -> str:
    return str(tuple(int(s) for s in t.shape))


def _param_doc(gm: nn.Module) -> list[str]:
    specs = getattr(gm, "autopar_shards", {}) or {}
    lines = []
    for name, p in list(gm.named_parameters()) + list(gm.named_buffers()):
        spec = specs.get(name)
        kind = "param " if isinstance(p, nn.Parameter) else "buffer"
        if spec is None or spec.dim is None:
            how = "replicated"
        elif spec.segments:
            how = f"split on dim {spec.dim}, per segment {tuple(spec.segments)}"
        else:
            how = f"split on dim {spec.dim}"
        orig = "" if spec is None or spec.name == name else f" (serial name {spec.name})"
        lines.append(f"  {kind} {name}: {_shape(p)} {str(p.dtype).replace('torch.', '')}, {how}{orig}")
    return lines


def _submodule_graphs(gm: nn.Module, prefix=""):
    """(path, GraphModule) of nested graph modules (attention cores, the row under full
    recompute), outermost first."""
    for name, sub in gm.named_children():
        if hasattr(sub, "graph") and hasattr(sub, "code"):
            yield prefix + name, sub
            yield from _submodule_graphs(sub, prefix + name + ".")
        elif isinstance(sub, nn.Module):
            yield from _submodule_graphs(sub, prefix + name + ".")


def emit(spec: str, plan, out_dir: str, seq: int | None = None, leaf_modules=()) -> EmitResult:
    from autopar.models import load_model
    from autopar.runtime.emit.out_dir import check_emit_dir
    check_emit_dir(out_dir)     # before the model is built
    source = load_model(spec, seq=seq)
    attention = getattr(plan, "attention", "math")
    model = source.build("meta", seed=None, attention=attention)
    # the runtime's own pre-launch checks, row cut, stage split and row inputs, so --emit
    # refuses what the runtime refuses, with the same line, and shows what it runs
    example = source.example_inputs(plan.micro_batch_size, "cpu")
    table = None
    if leaf_modules:   # the balanced split of the table traced with those leaves
        from autopar.trace import table_for
        table = table_for(spec, plan.micro_batch_size, seq, tuple(leaf_modules))
    ready = check_before_launch(model, plan, spec=spec, seq=seq, table=table, example_inputs=example)
    rows, stages = ready.rows, ready.stages
    from autopar.runtime.step.context import local_example
    example = local_example(example, plan)   # cp: rows run on S / cp tokens (shown for cp rank 0)
    inputs = row_inputs(rows, example, stages, range(len(stages)))
    os.makedirs(out_dir, exist_ok=True)
    result = EmitResult(out_dir=out_dir, stages=stages)
    tp = plan.tp
    cache: dict[tuple, nn.Module] = {}
    row_coll: dict[int, list[dict]] = {}

    def rewritten(i, r):
        mod, kind = rows.modules[i], rows.kinds[i]
        x = inputs.get(i)   # None: rewrite_row infers it, as in the runtime
        key = (kind, repr(mod), None if x is None else (tuple(x.shape), str(x.dtype)), r)
        if key not in cache:
            cache[key] = rewrite_row(mod, kind=kind, tp_rank=r, tp_size=tp, tp_group=FakeGroup(r, tp),
                                     sequence_parallel=plan.sequence_parallel, recompute=plan.recompute,
                                     example_input=x,
                                     context_parallel=dict(cp=plan.cp, rank=0, group=FakeGroup(0, plan.cp),
                                                           name=rows.names[i]) if plan.cp > 1 else None)
        return cache[key]

    for v, (a, b) in enumerate(stages):
        for r in range(tp):
            fname = f"stage{v}_tp{r}.py"
            parts, wrapped, seen_code = [], set(), {}
            for i in range(a, b):
                gm = rewritten(i, r)
                name, kind = rows.names[i], rows.kinds[i]
                cls = _py_name(name)
                if r == 0:
                    row_coll[i] = collective_rows(gm)
                code_key = (gm.code, tuple(_param_doc(gm)))
                if code_key in seen_code:
                    parts.append(f"class {cls}({seen_code[code_key]}):\n    \"\"\"{name} ({kind}): "
                                 f"same code and shapes as {seen_code[code_key]}, its own weights.\"\"\"\n")
                    continue
                seen_code[code_key] = cls
                doc = [f"{name} ({kind}) for tensor-parallel rank {r} of {tp}; "
                       f"serial input {_input_shape(inputs.get(i))}.",
                       f"rewritten: sequence_parallel={plan.sequence_parallel}, recompute={plan.recompute!r}",
                       "parameters and buffers (local shape, how split from the serial row):",
                       *(_param_doc(gm) or ["  (none)"])]
                colls = collectives_of(gm)
                if colls:
                    doc.append("collectives (tp group):")
                    doc += [f"  self.{c['name']}: {c['module']} (forward {c['fwd']}, backward {c['bwd']})"
                            for c in colls]
                text, w = _class_code(cls, gm, doc)
                wrapped |= w
                parts.append(text)
                for sub_path, sub in _submodule_graphs(gm):
                    sub_doc = [f"{name}: submodule self.{sub_path} ({type(sub).__name__}), run under "
                               "torch.utils.checkpoint(use_reentrant=False)"]
                    if sub_path == "row":
                        sub_doc.append("parameters: see the outer class (names without 'row.')")
                    t2, w2 = _class_code(f"{cls}__{_py_name(sub_path)}", sub, sub_doc)
                    wrapped |= w2
                    parts.append(t2)
            header = [
                f"# autopar apply --emit: {spec}",
                f"# plan: {plan.to_json()}",
                f"# virtual pipeline stage {v} of {len(stages)} (pipeline rank {rank_of_stage(plan, v)} of {plan.pp}), "
                f"tensor-parallel rank {r} of {tp}",
                f"# rows [{a}, {b}): {', '.join(rows.names[a:b])}",
                "# Generated from the torch.fx graphs the runtime executes (GraphModule.code); readable,",
                "# not meant to be imported. Collectives are the leaf modules listed in each docstring.",
                "import math",
                "import torch",
                "from torch import device  # noqa: F401  (fx prints devices as device(...))",
                "inf = float('inf')",
                "nan = float('nan')",
            ]
            for w in sorted(wrapped):
                mod, _, fn = w.partition("_")
                header.append(f"{w} = {mod}.{fn}  # torch.fx auto-wrapped call")
            path = os.path.join(out_dir, fname)
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(header) + "\n\n\n" + "\n\n".join(parts))
            result.files.append(path)

    result.summary_path = os.path.join(out_dir, "SUMMARY.md")
    with open(result.summary_path, "w", encoding="utf-8") as f:
        f.write(summary(spec, plan, rows, stages, row_coll, result.files))
    return result
