"""The report's "Run it" section: how to run the best plan of each search with each trainer —
the ``autopar export`` command and the launch line it writes (torchrun for autopar's runtime,
Megatron-LM, torchtitan, DeepSpeed), or, where a trainer cannot run that plan, its one-line
refusal naming the field and the nearest plan it can (``autopar.export``)."""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.contracts.errors import AutoparError

TRAINERS = ("torchrun", "megatron", "torchtitan", "deepspeed")
EXTENSIONS = {"torchrun": "sh", "megatron": "sh", "torchtitan": "toml", "deepspeed": "json"}
WITHOUT_LAUNCH = {"torchtitan": "the job TOML torchtitan's train.py reads with --job.config_file"}


@dataclass
class RunLine:
    trainer: str
    command: str            # the autopar export command
    launch: str | None      # the torchrun line the export writes (None: refused)
    refusal: str | None = None   # why the trainer cannot run it, or what the file is


def run_lines(record, source: str = "plans.json") -> list[RunLine]:
    """One line per trainer for ``record`` (a ranked plan); empty without a model to export for."""
    model = record.get("model")
    if not model:
        return []
    from autopar.export import context_for, export_plan
    try:
        ctx = context_for(model, seq=record.get("seq"), gpus=record.plan.world_size,
                          global_batch=record.get("global_batch"), hardware=record.get("hardware"))
    except AutoparError:
        return []
    out = []
    for trainer in TRAINERS:
        out_file = f"run-{trainer}.{EXTENSIONS[trainer]}"
        command = f"autopar export {source} --index {record.file_rank} --to {trainer} -o {out_file}"
        try:
            files = export_plan(record.plan, trainer, ctx).files
        except AutoparError as e:
            out.append(RunLine(trainer, command, None, str(e)))
            continue
        text = "\n".join(files.values())
        start = text.find("torchrun ")
        launch = text[start:].strip() if start >= 0 else None
        note = None if launch else f"writes {out_file}: {WITHOUT_LAUNCH.get(trainer, 'the configuration')}"
        out.append(RunLine(trainer, command, launch, note))
    return out
