"""Sequence parallelism on activations whose batch and sequence dims the model flattened.

Under sequence parallel a block holds its rank's chunk of the sequence, ``(B, S/tp, C)``, and the
collectives around a tensor-parallel pair gather / reduce-scatter along dim 1. OPT's decoder
layer (and other code written for 2-D matmuls) flattens the tokens first —
``hidden.reshape(-1, hidden.size(-1))`` — so the MLP pair sees ``(B·S/tp, C)``: the sequence
shard now lies *inside* dim 0, each batch row holding its own chunk. Gathering that along dim 1
(the hidden size) was the failure ("a and b must have same reduction dim"), and gathering along
dim 0 would interleave the batch rows wrongly for B > 1.

Here such a "flat tokens" tensor is recognised by its serial shape — dim 0 is the row's B·S
tokens (B, S from the row's input) while dims 0–1 are not (B, S) — and:

* a view that merges (B, S/tp) or splits B·S/tp back keeps the shard on the sequence part
  (:meth:`FlatTokens._flat_tokens_view_dim`, used by ``sizes``);
* a sequence collective on it runs on the unflattened ``(B, S/tp, …)`` view and flattens its
  result again (:meth:`FlatTokens._seq_collective`), so the gathered tokens are in serial order.
"""
from __future__ import annotations

import math

from autopar.rewrite.fx_util import is_tensor


class FlatTokens:
    """Mixin of the rewrite (``tp._Rewriter``); needs ``LocalGraph``'s state and helpers."""

    def _tokens(self):
        """(B, S) of the row's input under sequence parallel in a block / head, else None."""
        if not self.sp or self.kind not in ("block", "head"):
            return None
        first = next((n for n in self.old.nodes if n.op == "placeholder"), None)
        val = self.full.get(first) if first is not None else None
        if not is_tensor(val) or val.dim() < 2:
            return None
        return int(val.shape[0]), int(val.shape[1])

    def _is_flat_tokens(self, full) -> bool:
        """Whether serial value ``full`` holds the row's B·S tokens flattened into dim 0."""
        bs = self._tokens()
        if bs is None or not is_tensor(full) or full.dim() < 1 or bs[1] == 1:
            return False
        return int(full.shape[0]) == bs[0] * bs[1] and tuple(full.shape[:2]) != bs

    def _flat_tokens_view_dim(self, in_shape, sd, out_shape):
        """The output dim holding the sequence shard of a view that merges (B, S) into B·S
        (``sd`` = 1) or splits B·S (``sd`` = 0) into (B, S); None for any other view."""
        bs = self._tokens()
        if bs is None or bs[1] == 1:
            return None
        B, S = bs
        if sd == 1 and tuple(in_shape[:2]) == bs and len(out_shape) >= 1 and out_shape[0] == B * S:
            return 0
        if sd == 0 and in_shape[0] == B * S and tuple(out_shape[:2]) == bs and \
                math.prod(in_shape[1:]) == math.prod(out_shape[2:]):
            return 1
        return None

    def _seq_collective(self, cls, x, full, base, **kw):
        """Collective ``cls`` (along the sequence, dim 1) on new node ``x`` whose serial value is
        ``full``; a flat-tokens ``x`` goes through its ``(B, S/tp, …)`` view and back."""
        if not self._is_flat_tokens(full):
            return self._collective(cls, x, base, **kw)
        B = self._tokens()[0]
        rest = tuple(int(d) for d in full.shape[1:])
        shaped = self._add("call_method", "view", (x, B, -1, *rest), name=f"{x.name}_tokens")
        node = self._collective(cls, shaped, base, **kw)
        return self._add("call_method", "reshape", (node, -1, *rest), name=f"{node.name}_flat")
