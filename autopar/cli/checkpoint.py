"""``autopar checkpoint show|export CKPT``: what an autopar checkpoint holds, and its serial
state dict as one file.

``export`` streams the tensors one at a time (``autopar.runtime.checkpoints.export.export_checkpoint``), so
no process ever holds the whole model: ``-o model.safetensors``, ``-o model.pt`` (torch.save
cannot stream: that one holds the model), or ``-o DIR`` for an ``hf:`` model (a Hugging Face
directory, loadable with ``from_pretrained`` next to its config).
"""
from __future__ import annotations

from autopar.cli.common import human, print_json


def register(subparsers) -> None:
    p = subparsers.add_parser("checkpoint", help="show or export an autopar checkpoint",
                              description="Show what an autopar checkpoint (runner.save) holds, "
                                          "or export its serial state dict.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="the plan, model, step and tensors of a checkpoint")
    show.add_argument("ckpt", metavar="CKPT", help="the directory runner.save wrote")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.set_defaults(run=run_show)
    export = sub.add_parser("export", help="write the serial state dict, streamed",
                            description="Write the serial model's state dict, one tensor at a "
                                        "time: .safetensors, .pt, or a directory for hf: models.")
    export.add_argument("ckpt", metavar="CKPT", help="the directory runner.save wrote")
    export.add_argument("-o", "--output", required=True,
                        help="model.safetensors, model.pt, or a directory (hf: models)")
    export.set_defaults(run=run_export)


def run_show(args) -> int:
    from autopar.runtime.checkpoints.dcp_files import checkpoint_dir, read_object, tensor_metadata
    from costmodels.contracts.plan import Plan
    ckpt = checkpoint_dir(args.ckpt)
    info = read_object(ckpt)
    tensors = {k: list(v.size) for k, v in tensor_metadata(ckpt).items() if k.startswith("model.")}
    numel = sum(_numel(s) for s in tensors.values())
    out = {"checkpoint": ckpt, "model": info.get("spec"), "step": info.get("step"),
           "global_batch": info.get("global_batch"), "world_size": info.get("world_size"),
           "plan": info.get("plan"), "parameters": numel, "tensors": len(tensors),
           "extra": info.get("extra")}
    if args.json:
        print_json(_jsonable(out))
        return 0
    print(f"checkpoint  {ckpt}")
    print(f"model       {out['model'] or '(not named: apply(spec=...) was not given)'}")
    print(f"plan        {Plan.from_dict(out['plan']).label()} on {out['world_size']} rank(s)")
    print(f"step        {out['step']}   global batch {out['global_batch']}")
    print(f"tensors     {out['tensors']} ({human(numel)} values)")
    print(f"extra       {out['extra']}")
    return 0


def _jsonable(value):
    """``extra`` as JSON: a tensor (a data loader's RNG state) as its dtype and shape, any other
    object as its repr, so that ``--json`` prints every checkpoint."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return {"tensor": str(value.dtype).replace("torch.", ""), "shape": list(value.shape)}
    return repr(value)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def run_export(args) -> int:
    from autopar.runtime.checkpoints.export import export_checkpoint
    out = export_checkpoint(args.ckpt, args.output)
    print(f"wrote {out}")
    return 0
