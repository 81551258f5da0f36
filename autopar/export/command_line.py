"""Reading a user's launch command: a flag list, a ``torchrun ... pretrain_gpt.py ...`` line, or a
whole shell script such as Megatron-LM's ``examples/gpt3/train_gpt3_175b_distributed.sh``.

The text is split as a shell would (comments, ``\\`` line continuations, bash arrays
``NAME=( ... )``), plain ``NAME=value`` assignments are substituted for ``$NAME`` / ``${NAME}``,
and only the flags autopar reads are kept; everything else (data, tokenizer, optimizer, logging)
is ignored. Values stay strings: each reader converts the ones it needs and names the flag when
one is not a number.
"""
from __future__ import annotations

import argparse
import re
import shlex

from costmodels.contracts.errors import PlanError

# Megatron-LM / Megatron-DeepSpeed flags with a value, and the torchrun flags that give the GPUs.
VALUE_FLAGS = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-experts",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout", "--micro-batch-size",
    "--global-batch-size", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--data-parallel-sharding-strategy", "--attention-backend", "--num-layers", "--hidden-size",
    "--num-attention-heads", "--ffn-hidden-size", "--num-query-groups", "--num-key-value-heads",
    "--seq-length", "--zero-stage", "--ds-sequence-parallel-size",
    "--nnodes", "--nproc-per-node", "--nproc_per_node", "--plan", "--model", "--global-batch",
    "--fp8-format", "--fp8-recipe",   # the plan's precision (autopar.export.precision_flags)
    "--num-distributed-optimizer-instances",
)
# flags with a list of values (Megatron-core: one --cp-comm-type per layer, or one for all)
LIST_FLAGS = ("--cp-comm-type",)
SWITCH_FLAGS = (
    "--sequence-parallel", "--recompute-activations", "--checkpoint-activations",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--use-torch-fsdp2", "--use-flash-attn",
    "--use-flash-attn-v1", "--use-flash-attn-v2", "--use-tp-pp-dp-mapping", "--group-query-attention",
    "--no-pipeline-parallel", "--deepspeed", "--fp16", "--bf16", "--tp-comm-overlap",
)


def dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for flag in VALUE_FLAGS:
        p.add_argument(flag, dest=dest(flag), default=None)
    for flag in SWITCH_FLAGS:
        p.add_argument(flag, dest=dest(flag), action="store_true")
    for flag in LIST_FLAGS:
        p.add_argument(flag, dest=dest(flag), nargs="+", default=None)
    return p


def shell_words(text: str) -> list[str]:
    """The words of a shell text, with simple ``NAME=value`` assignments substituted."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    assigned = dict(re.findall(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=([\w.:/-]+)\s*(?:#.*)?$", text, re.M))

    def substitute(m):
        name = m.group(1) or m.group(2)
        return assigned.get(name, m.group(0))
    text = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", substitute, text)
    try:
        return shlex.split(text, comments=True)
    except ValueError as e:
        raise PlanError(f"cannot split the command line as a shell would ({e}); check its quotes") from None


def read_flags(text: str) -> dict:
    """{dest: value} of the flags autopar reads (value flags: the last value given, a string;
    switches: True / False)."""
    words = shell_words(text)
    try:
        known, _ = _parser().parse_known_args(words)
    except argparse.ArgumentError as e:
        raise PlanError(f"cannot read the command line: {e}") from None
    return vars(known)


def torchrun_gpus(flags: dict) -> int | None:
    """nnodes · nproc-per-node when both are plain integers (an elastic ``1:4`` is not)."""
    nodes, per_node = flags.get("nnodes"), flags.get("nproc_per_node")
    if nodes is None and per_node is None:
        return None
    try:
        return int(nodes or 1) * int(per_node or 1)
    except ValueError:
        return None


def format_args(pairs: list[tuple[str, object] | str], indent: str = "    ") -> str:
    """One flag (and its value, shell-quoted) per line."""
    lines = []
    for item in pairs:
        if isinstance(item, str):
            lines.append(indent + item)
        else:
            flag, value = item
            lines.append(f"{indent}{flag} {shlex.quote(str(value))}")
    return "\n".join(lines)


def flag_list(pairs: list[tuple[str, object] | str]) -> list[str]:
    """The same pairs as argv words (comments dropped)."""
    out = []
    for item in pairs:
        if isinstance(item, str):
            if not item.startswith("#"):
                out.append(item)
        else:
            out += [item[0], str(item[1])]
    return out
