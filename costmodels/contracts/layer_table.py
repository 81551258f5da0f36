"""The layer table: what the cost model knows about a model, and nothing about torch.

``autopar.trace`` measures a model (torch.fx on fake tensors) and produces a ``LayerTable``;
the cost model and the search read it. It lives here, in the torch-free package, so that the
cost model can be used (and tested) on tables built or loaded without torch, e.g. from JSON.

Rows are the model's pipeline-cuttable units in execution order: the embedding, each repeated
block, and the head (final norm + output projection) each get one row. Pipeline ``stages`` in a
plan are half-open ranges over these rows.

All per-row FLOPs and bytes are for ONE micro-batch of ``micro_batch`` sequences of ``seq``
tokens, in the table's activation dtype (``act_dtype_bytes``, 2 for bf16). Both are exactly
linear in the micro-batch size for the models autopar supports, so the cost model scales them
by ``b / micro_batch`` instead of re-tracing.

Activation bytes saved for backward are split the way tensor / sequence parallelism and
selective recompute treat them (Korthikanti et al. 2022, §4):

* ``act_tp_bytes``: saved inside tensor-parallel regions (between a column-parallel linear and
  its row-parallel partner: Q/K/V, attention scores, GeLU input, ...). Divided by ``tp``.
* ``act_attention_core_bytes``: the part of ``act_tp_bytes`` that selective recompute drops
  (softmax output, attention dropout mask and output: the ``5·a·s²·b`` term). Zero with fused
  (flash) attention.
* the rest, ``saved_activation_bytes - act_tp_bytes``, is replicated across tp ranks (layer-norm
  inputs, inputs of column-parallel linears, residual dropout masks); sequence parallel divides
  it by ``tp``.
* ``act_attention_mask_bytes``: of the rest, the causal mask math attention saves (``s²``
  bytes per block); gone with flash attention.
* ``boundary_bytes``: the row's output; what a pipeline stage sends on, and what full recompute
  keeps per layer.

``bwd_weight_flops`` is the part of ``bwd_flops`` that computes weight gradients (W), the rest
being the input gradients (B) the previous pipeline stage waits for; the zero-bubble schedules
run the two apart. The trace counts it as the FLOPs of every forward product with a trainable
weight operand (a linear's ``dW = dYᵀ·X`` costs what its forward did; attention's Q·Kᵀ and
scores·V have no weight: all B). A table written before the field existed (or any row that
leaves it out, ``None``) is read as ``bwd_flops / 2``: the share of a model made of linear layers,
whose backward is one dX and one dW product per forward product (``LayerRow.weight_grad_flops``).
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from costmodels.contracts.table_checks import check_table


@dataclass(frozen=True)
class TPPair:
    """A Megatron column-parallel / row-parallel pair of linears inside one row.

    ``column`` are the linears split along their output features (e.g. ``attn.c_attn`` or
    ``mlp.w1``/``mlp.w3``); ``row`` is the one split along its input features (``attn.c_proj``).
    ``heads`` / ``kv_heads`` are the head counts the rewrite must divide by tp (None for an MLP).
    """

    column: tuple[str, ...]
    row: str
    heads: int | None = None
    kv_heads: int | None = None


@dataclass(frozen=True)
class LayerRow:
    name: str                      # module path, e.g. "blocks.3", or "embedding" / "head"
    kind: str                      # "embedding" | "block" | "head" | "other"
    params: int                    # parameter count (a tied parameter counted in its first row only)
    fwd_flops: float               # forward FLOPs for one micro-batch (FlopCounterMode)
    bwd_flops: float               # backward FLOPs for one micro-batch
    saved_activation_bytes: int    # bytes saved for backward, no parallelism, no recompute
    act_tp_bytes: int = 0          # of which: saved inside TP regions (divided by tp)
    act_attention_core_bytes: int = 0  # of which: dropped by selective recompute
    boundary_bytes: int = 0        # output bytes sent to the next stage
    tp_pairs: tuple[TPPair, ...] = ()
    tied_params: tuple[str, ...] = ()  # names of parameters shared with another row
    tp_comm_bytes: int = 0         # bytes of one TP all-reduce in this row (b·s·h·dtype), 0 if none
    matmul_dims: tuple[tuple[int, int, int], ...] = ()  # (m, n, k) of the row's matmuls, for efficiency curves
    tp_replicated_tensors: int = 0  # parameter tensors of a block TP leaves whole (norms, row biases):
                                    # with sequence parallel each needs its gradient all-reduced
    act_attention_mask_bytes: int = 0  # of saved_activation_bytes, outside act_tp_bytes: the causal
                                    # mask materialised attention saves (masked_fill's bool s×s),
                                    # which flash attention never makes
    bwd_weight_flops: float | None = None  # of bwd_flops: the weight gradients (None: bwd_flops / 2)
    # Mixture of Experts (0 in a dense row; left out of the JSON at 0, MOE_FIELDS): of params,
    # the routed experts' (sharded over ep); the routed experts of its MoE layer; the
    # token-expert assignments of one micro-batch (b·s·top_k, summed over the row's MoE layers);
    # one all-to-all's whole buffer (routed_tokens·hidden·act_dtype_bytes: the dispatch, and
    # the combine, each move this); of fwd_flops, the routed experts' (the grouped GEMMs)
    expert_params: int = 0
    experts: int = 0
    routed_tokens: int = 0
    dispatch_bytes: int = 0
    expert_fwd_flops: float = 0.0

    @property
    def weight_grad_flops(self) -> float:
        """The backward's weight-gradient FLOPs, ``bwd_flops / 2`` when not measured (docstring)."""
        return self.bwd_flops / 2 if self.bwd_weight_flops is None else float(self.bwd_weight_flops)


# the MoE row fields: written to a table's JSON only where non-zero, so dense tables are unchanged
MOE_FIELDS = ("expert_params", "experts", "routed_tokens", "dispatch_bytes", "expert_fwd_flops")


@dataclass(frozen=True)
class LayerTable:
    model: str                     # the spec string the table was traced from
    micro_batch: int               # b the per-row figures are for
    seq: int                       # s
    hidden: int | None             # h (None for models without one, e.g. user code)
    heads: int | None              # attention heads (None when not a transformer)
    kv_heads: int | None
    vocab: int | None
    layers: int                    # number of repeated blocks
    act_dtype_bytes: int           # 2 for bf16
    rows: tuple[LayerRow, ...] = field(default_factory=tuple)
    # False: the model has no fused (SDPA / flash) attention (transformers' Gemma-2, BLOOM,
    # DeBERTa-v2); it runs materialised attention whatever plan.attention asks, and the estimate
    # prices that. Left out of the JSON when True.
    fused_attention: bool = True

    @property
    def total_params(self) -> int:
        return sum(r.params for r in self.rows)

    def block_rows(self) -> list[int]:
        return [i for i, r in enumerate(self.rows) if r.kind == "block"]

    @property
    def is_moe(self) -> bool:
        return any(r.experts for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["fused_attention"]:
            del d["fused_attention"]
        for r in d["rows"]:
            for k in MOE_FIELDS:
                if not r[k]:
                    del r[k]
        d["total_params"] = self.total_params
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerTable:
        """Read ``to_dict()``'s JSON or ``autopar inspect --json``'s; every field is checked for
        its type and a plausible range first (``costmodels.contracts.table_checks``: one SpecError line
        naming the row and the field), so a table that loads gives finite estimates."""
        row_fields = tuple(f.name for f in fields(LayerRow))
        required = tuple(f.name for f in fields(LayerRow) if f.default is MISSING and f.default_factory is MISSING)
        top, rows = check_table(d, tuple(f.name for f in fields(cls) if f.name != "rows"), row_fields, required)
        built = []
        for r in rows:
            r["tp_pairs"] = tuple(TPPair(**p) for p in r["tp_pairs"])
            built.append(LayerRow(**r))
        return cls(rows=tuple(built), **top)
