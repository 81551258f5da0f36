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

from autopar.rewrite.cp_attention import sequence_slice
from costmodels.contracts.errors import PlanError


def context_slice(inputs: tuple, targets, cp: int, cp_rank: int):
    """(inputs, targets) cut to this cp rank's tokens along dim 1."""
    seq = inputs[0].size(1) if inputs[0].dim() >= 2 else None
    if seq is None or seq % (2 * cp):
        raise PlanError(f"plan field 'cp'={cp} cuts each sequence into 2·cp = {2 * cp} chunks but the "
                        f"inputs have {seq} tokens per sample; use a sequence length divisible by "
                        f"{2 * cp} or a smaller cp")

    def cut(t):
        if t is not None and t.dim() >= 2 and t.size(1) == seq:
            return sequence_slice(t, cp, cp_rank, dim=1)
        return t

    return tuple(cut(t) for t in inputs), cut(targets)
