"""The sequence under context parallelism: which tokens of each sample a cp rank runs.

Each cp rank feeds the whole samples of its dp rank; the Runner keeps its own tokens — chunks
``i`` and ``2·cp − 1 − i`` of ``2·cp`` (``autopar.rewrite.cp_attention.load_balanced_positions``)
— of every input and target laid out along the sequence (dim 1 of the same length as the first
input's), so the rewritten rows (position ids, rotary tables, attention: ``autopar.rewrite.
context_parallel``) and the loss see the tokens in one consistent order. The loss of a cp rank
is the mean over its tokens; the ranks' tokens being equally many, the mean of the cp ranks'
losses and the average of their gradients (over the dp·cp sync group,
``autopar.runtime.faults.sync_groups``) are the serial model's.
"""
from __future__ import annotations

import contextlib
import sys

import torch
import torch.fx

from autopar.rewrite.cp_attention import cp_positions, sequence_slice
from autopar.runtime.step.cp_masks import check_cp_masks, input_names
from costmodels.contracts.errors import PlanError


def context_slice(inputs: tuple, targets, cp: int, cp_rank: int, names=None, model: str = "the model"):
    """(inputs, targets) cut to this cp rank's tokens along dim 1; a padding or non-causal mask
    among the inputs is refused (``cp_masks``; ``names``: the forward's parameter names and
    ``model`` the model's class name, to name them)."""
    seq = inputs[0].size(1) if inputs[0].dim() >= 2 else None
    if seq is None or seq % (2 * cp):
        raise PlanError(f"plan field 'cp'={cp} cuts each sequence into 2·cp = {2 * cp} chunks but the "
                        f"inputs have {seq} tokens per sample; use a sequence length divisible by "
                        f"{2 * cp} or a smaller cp")
    check_cp_masks(inputs, seq, cp, names, model)

    def cut(t):
        if t is not None and t.dim() >= 2 and t.size(1) == seq:
            return sequence_slice(t, cp, cp_rank, dim=1)
        return t

    return tuple(cut(t) for t in inputs), cut(targets)


def local_example(example_inputs, plan, model=None):
    """One micro-batch's example inputs as a cp rank sees them (``S / cp`` tokens): what a model
    cut into rows by tracing (transformers models: sizes become literals) is traced on, so its
    rows run on the local tokens. Unchanged for cp = 1 or without example inputs."""
    if example_inputs is None or getattr(plan, "cp", 1) <= 1:
        return example_inputs
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if inputs[0].device.type == "meta":   # shapes only: any cp rank's slice has the same shape
        seq = inputs[0].size(1)
        return tuple(t[:, : seq // plan.cp] if t.dim() >= 2 and t.size(1) == seq else t for t in inputs)
    if model is None:
        return context_slice(inputs, None, plan.cp, 0)[0]
    return context_slice(inputs, None, plan.cp, 0, input_names(model), type(model).__name__)[0]


# transformers' mask builders index tensors with their aranges (the mask they build is not read
# under cp: the attention that would read it is replaced)
_MASK_BUILDERS = ("masking_utils.py", "modeling_attn_mask_utils.py")


@contextlib.contextmanager
def global_positions(t_local: int, cp: int, rank: int):
    """While a model is cut into rows by tracing it on ``t_local`` tokens (transformers models),
    ``torch.arange(t_local)`` / ``arange(0, t_local)`` — the position ids, ``cache_position`` —
    gives this cp rank's global positions, so what the trace folds into constants from them
    (rotary ``cos`` / ``sin`` tables) is this rank's rows of the tables. Aranges called from
    transformers' mask builders are left alone (``_MASK_BUILDERS``)."""
    real = torch.arange

    def arange(*args, **kwargs):
        ends = [a for a in args if not isinstance(a, torch.Tensor)]
        plain = (len(args) == 1 or (len(args) == 2 and args[0] == 0)) and not kwargs.get("step") \
            and "end" not in kwargs and "start" not in kwargs and len(ends) == len(args)
        caller = sys._getframe(1).f_code.co_filename
        if plain and isinstance(args[-1], int) and args[-1] == t_local and not caller.endswith(_MASK_BUILDERS):
            return cp_positions(t_local, cp, rank, device=kwargs.get("device"), dtype=kwargs.get("dtype"))
        return real(*args, **kwargs)

    torch.arange = arange
    try:
        yield
    finally:
        torch.arange = real


def rows_for_cp_rank(model, rows, example_inputs, plan, cp_rank: int):
    """This cp rank's rows: built-in models' rows as they are (their graphs are rewritten,
    ``autopar.rewrite.context_parallel``); a model cut by tracing is cut again with its position
    ids at this rank's global positions (``global_positions``)."""
    from autopar.runtime.assemble.rows import model_rows
    if plan.cp <= 1 or example_inputs is None or not any(
            isinstance(m, torch.fx.GraphModule) for m in rows.modules):
        return rows
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    with global_positions(inputs[0].size(1), plan.cp, cp_rank):
        return model_rows(model, inputs)


def check_position_constants(stage_modules, cut_rows, t_local: int) -> None:
    """Refuse (one line) a traced model whose rewritten rows still read a constant the trace
    folded from the local token count that is *not* this rank's: a position table the model
    slices from a buffer in its forward (``freqs_cis[:T]``, torchtitan's way) rather than
    computing from ``torch.arange``. ``cut_rows``: the rows cut with positions ``0 … T−1``;
    a constant equal there and here, with a dim of ``t_local``, did not follow the positions."""
    if cut_rows is None:
        return
    for stage in stage_modules:
        for gm in stage.modules():
            if not isinstance(gm, torch.fx.GraphModule):
                continue
            for n in gm.graph.nodes:
                if n.op != "get_attr" or "_tensor_constant" not in n.target:
                    continue
                mine = _attr(gm, n.target)
                theirs = next((t for m in cut_rows.modules if (t := _attr(m, n.target)) is not None), None)
                if (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
                        and not mine.is_meta and mine.shape == theirs.shape and t_local in mine.shape
                        and torch.equal(mine, theirs.to(mine.device))):
                    raise PlanError(f"context parallel: a block of this model reads a tensor its forward "
                                    f"computes from the first {t_local} positions without torch.arange "
                                    f"('{n.target}', e.g. a rotary table sliced from a buffer), which cannot "
                                    "follow the sequence chunks a cp rank holds; compute it from "
                                    "torch.arange(seq) positions, or use cp=1")


def _attr(module, target: str):
    obj = module
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
