"""Split points in the words launchers use: blocks per virtual stage.

autopar's ``stages`` are half-open layer-table row ranges per virtual stage (row 0 the embedding,
the last row the head). Every launcher here puts the embedding with the first virtual stage and
the head with the last, so a split is exactly its list of transformer-block counts per virtual
stage (``block_counts`` and ``stages_from_counts`` are inverse). What each launcher can say:

* an even split (every virtual stage the same number of blocks): Megatron-LM's and DeepSpeed's
  default;
* first / last stage different, the rest even: Megatron-LM's
  ``--decoder-first/last-pipeline-num-layers`` (no virtual stages);
* anything: Megatron-LM's ``--pipeline-model-parallel-layout`` and torchtitan's
  ``module_fqns_per_model_part``.
"""
from __future__ import annotations

import re

from costmodels.contracts.errors import PlanError


def block_counts(stages, n_rows: int) -> list[int]:
    """Transformer blocks in each virtual stage (rows 1 … n_rows-2 are blocks)."""
    return [max(0, min(b, n_rows - 1) - max(a, 1)) for a, b in stages]


def stages_from_counts(counts: list[int], n_rows: int, where: str) -> tuple[tuple[int, int], ...]:
    """Row ranges for ``counts`` blocks per virtual stage, the embedding with the first and the
    head with the last; PlanError (naming ``where``) unless they add up to the model's blocks and
    every stage has a row."""
    n_blocks = n_rows - 2
    if any(c < 0 for c in counts) or sum(counts) != n_blocks:
        raise PlanError(f"{where}: the stages hold {sum(counts)} layers ({counts}) but the model has "
                        f"{n_blocks}; make them add up to {n_blocks}")
    out, start = [], 0
    for v, c in enumerate(counts):
        end = start + c + (v == 0) + (v == len(counts) - 1)
        if end == start:
            raise PlanError(f"{where}: virtual stage {v} has no layer; give every middle stage at "
                            "least one transformer layer")
        out.append((start, end))
        start = end
    return tuple(out)


def even_counts(n_blocks: int, n_stages: int) -> list[int] | None:
    """Blocks per stage of the even split, None when ``n_stages`` does not divide the blocks."""
    if n_stages < 1 or n_blocks % n_stages:
        return None
    return [n_blocks // n_stages] * n_stages


def first_last_counts(n_blocks: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Megatron-LM's uneven split: ``first`` / ``last`` blocks on the end stages (when given), the
    remaining blocks evenly over the other stages."""
    left, stages_left = n_blocks, pp
    for given in (first, last):
        if given is not None:
            left -= given
            stages_left -= 1
    if stages_left < 0 or left < 0 or (stages_left and left % stages_left) or (not stages_left and left):
        raise PlanError(f"megatron --decoder-first/last-pipeline-num-layers {first}/{last}: the other "
                        f"{stages_left} stage(s) cannot share the remaining {left} of {n_blocks} layers "
                        "evenly; change the two counts")
    middle = left // stages_left if stages_left else 0
    counts = [middle] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


# ---- Megatron-LM's --pipeline-model-parallel-layout ------------------------------------------
def megatron_layout(counts: list[int]) -> str:
    """``E`` (embedding), ``t`` (a transformer layer, ``t*N`` for N), ``L`` (output layer and loss),
    stages in virtual-stage order separated by ``|``: e.g. ``Et*3|t*4|t*4|t*3L``."""
    parts = []
    for v, c in enumerate(counts):
        s = "E" if v == 0 else ""
        s += "" if c == 0 else "t" if c == 1 else f"t*{c}"
        s += "L" if v == len(counts) - 1 else ""
        parts.append(s)
    return "|".join(parts)


def parse_megatron_layout(text: str) -> list[int]:
    """Blocks per virtual stage of a layout string (``(..)*N`` groups, ``X*N`` repeats, commas);
    PlanError for what autopar has no row for (``m``: multi-token prediction) or a misplaced E/L."""
    s = text.replace(",", "").replace(" ", "")
    group = re.compile(r"\(([^()]*)\)\*(\d+)")
    while group.search(s):
        s = group.sub(lambda m: m.group(1) * int(m.group(2)), s)
    stages = s.split("|")
    counts = []
    for v, stage in enumerate(stages):
        items = re.findall(r"([A-Za-z])(?:\*(\d+))?", stage)
        if "".join(f"{k}*{n}" if n else k for k, n in items) != stage:
            raise PlanError(f"megatron --pipeline-model-parallel-layout '{text}': cannot read stage "
                            f"{v} '{stage}'; use E, t, L, t*N, (..)*N and '|'")
        letters = "".join(k * int(n or 1) for k, n in items).lower()
        if set(letters) - set("etl"):
            raise PlanError(f"megatron --pipeline-model-parallel-layout '{text}': layer type(s) "
                            f"{sorted(set(letters) - set('etl'))} have no autopar row (only E, t, L)")
        if ("e" in letters) != (v == 0) or letters.count("e") > 1 or (letters and "e" in letters[1:]):
            raise PlanError(f"megatron --pipeline-model-parallel-layout '{text}': the embedding E must "
                            "open the first stage, once")
        if ("l" in letters) != (v == len(stages) - 1) or letters.count("l") > 1 or \
                ("l" in letters and not letters.endswith("l")):
            raise PlanError(f"megatron --pipeline-model-parallel-layout '{text}': the loss L must close "
                            "the last stage, once")
        counts.append(letters.count("t"))
    return counts


# ---- torchtitan's module_fqns_per_model_part (llama-style module names) ----------------------
def torchtitan_fqns(stages, n_rows: int) -> list[list[str]]:
    """torchtitan's module names per model chunk: ``tok_embeddings``, ``layers.i``, ``norm`` and
    ``output`` (row 0, blocks, the head row's two modules)."""
    out = []
    for a, b in stages:
        names = []
        for row in range(a, b):
            names += (["tok_embeddings"] if row == 0 else ["norm", "output"] if row == n_rows - 1
                      else [f"layers.{row - 1}"])
        out.append(names)
    return out


def stages_from_torchtitan_fqns(chunks, n_rows: int) -> tuple[tuple[int, int], ...]:
    """Row ranges of torchtitan model chunks; PlanError unless each chunk is a contiguous run of
    rows and together they cover the model once, in order."""
    where = "torchtitan parallelism.module_fqns_per_model_part"
    rows_of = []
    for i, chunk in enumerate(chunks):
        rows = []
        for name in chunk:
            m = re.fullmatch(r"layers\.(\d+)", str(name))
            row = (0 if name == "tok_embeddings" else n_rows - 1 if name in ("norm", "output")
                   else int(m.group(1)) + 1 if m else None)
            if row is None or not 0 <= row < n_rows:
                raise PlanError(f"{where}: chunk {i} names '{name}', not one of tok_embeddings, "
                                f"layers.0 … layers.{n_rows - 3}, norm, output")
            if not rows or rows[-1] != row:
                rows.append(row)
        rows_of.append(rows)
    stages, expect = [], 0
    for i, rows in enumerate(rows_of):
        if not rows or rows != list(range(expect, expect + len(rows))):
            raise PlanError(f"{where}: chunk {i} is not the contiguous run of rows that follows chunk "
                            f"{i - 1}; list the modules in model order")
        stages.append((expect, expect + len(rows)))
        expect += len(rows)
    if expect != n_rows:
        raise PlanError(f"{where}: the chunks cover {expect} of the model's {n_rows} rows; name every "
                        "module once")
    return tuple(stages)


def torchtitan_default_counts(n_blocks: int, n_stages: int, input_weight: int,
                              output_weight: int) -> list[int]:
    """Blocks per stage when torchtitan derives the split itself (no module names): the embedding
    counts as ``input_weight`` layers and the head as ``output_weight``; the effective layers are
    shared as evenly as possible, the first stages taking the remainder (what torchtitan 0.2's
    ``pipeline_parallel_first/last_stage_less_layers`` describe)."""
    if n_stages == 1:
        return [n_blocks]
    effective = n_blocks + input_weight + output_weight
    base, extra = divmod(effective, n_stages)
    if base == 0 or input_weight > base or output_weight > base:
        raise PlanError(f"torchtitan cannot split {n_blocks} layers into {n_stages} stages with "
                        f"first/last_stage_less_layers {input_weight}/{output_weight}; give "
                        "module_fqns_per_model_part")
    counts, left = [], n_blocks
    for v in range(n_stages):
        want = base + (v < extra) - (input_weight if v == 0 else 0) - \
            (output_weight if v == n_stages - 1 else 0)
        take = max(0, min(want, left))
        counts.append(take)
        left -= take
    if left:
        raise PlanError(f"torchtitan's derived split leaves {left} layer(s) unplaced; give "
                        "module_fqns_per_model_part")
    return counts
