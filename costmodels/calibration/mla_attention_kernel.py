"""Which attention kernel a Megatron / NeMo row's Transformer Engine ran for DeepSeek-V3's Multi-head
Latent Attention, and the plan fields that say so (issue 27: the dgxc DeepSeek-V3 GB200 rows).

MLA's attention core has a query-key head width ``d_qk = 128 + 64 = 192`` and a value width
``d_v = 128`` (``costmodels.calibration.mla``). Transformer Engine picks the core's kernel in
``get_attention_backend`` (``transformer_engine/pytorch/dot_product_attention/utils.py``) and, for
cuDNN's fused attention, ``nvte_get_fused_attn_backend``
(``transformer_engine/common/fused_attn/fused_attn.cpp``). At NVIDIA/TransformerEngine
bee4649c15a79ffcb9689ca7c0c963f5febaa28a (2.2.0.dev0, the commit NVIDIA/NeMo v2.3.1's
``requirements/manifest.json`` pins, so the ``nvcr.io/nvidia/nemo:25.04.01`` container of the
dgxc-benchmarking v25.05.05 DeepSeek-V3 runs; ``external/patches/nemo_2.3.0_te.patch`` leaves
attention alone):

* FlashAttention is disabled whenever ``head_dim_qk != head_dim_v`` ("Disabling FlashAttention as
  it does not support MLA", utils.py lines 466-471);
* cuDNN's F16 fused attention refuses ``sm_arch >= 100 && (head_dim_qk > 128 || head_dim_v > 128)``
  ("special conditions for blackwell", fused_attn.cpp line 221) — on Hopper ``head_dim <= 256``
  passes (lines 232-236), so the H100 rows ran cuDNN's fused kernel;
* what is left on a Blackwell GPU is ``UnfusedDotProductAttention``: ``torch.baddbmm`` into a
  materialised ``[b·heads, s, s]`` score tensor, ``FusedScaleMaskSoftmax`` (its fused masked
  kernel at ``16 < s < 16384``), dropout at p = 0 (a no-op) and ``torch.bmm`` with ``v``: the plan's
  ``attention = "math"``.

Blackwell support for ``d_qk = 192, d_v = 128`` in training arrived in TE 71c76b6ba ("Add support
for head_dim > 128", 2025-06-13, first in v2.5) with cuDNN 9.11 — after the container. The same
launch asks for ``--recompute_modules core_attn`` on GB200 only (dgxc-benchmarking v25.05.05
``deepseek_v3/pretraining/launch.sh``; ``mla_up_proj`` on H100): Megatron-core's selective
recompute of the core attention (``recompute_granularity = "selective"``), which keeps the scores
out of memory and runs the core's forward again in the backward — autopar's ``recompute =
"selective"`` (``costmodels.model.compute``: the core's forward again, at the matmul efficiency and
the element-wise rate; ``memory``: the core's saved bytes dropped). Priced as the code ran; no
constant is fitted to these rows.
"""
from __future__ import annotations

# Container -> the Transformer Engine commit its NeMo release pins, for the Blackwell rule above.
# Only containers whose TE predates 71c76b6ba (Blackwell MLA training in cuDNN's fused attention).
TE_WITHOUT_BLACKWELL_MLA = {
    "nemo:25.04.01": "NVIDIA/TransformerEngine bee4649c15a7 (NVIDIA/NeMo v2.3.1 requirements/manifest.json)",
}
BLACKWELL_GPUS = ("GB200", "B200")
# Megatron-core's --recompute-modules entry that is autopar's "selective" recompute
CORE_ATTN_MODULE = "core_attn"


def _gpu(row: dict) -> str:
    return (row.get("gpu") or "").split("(")[0].strip()


def row_attention(row: dict, mla: bool) -> str:
    """``"math"`` where the row's Transformer Engine ran MLA's core unfused (a Blackwell GPU and a
    container in ``TE_WITHOUT_BLACKWELL_MLA``), else ``"flash"`` (module docstring). ``mla``: the
    row's attention is MLA (``moe_runs.row_mla``)."""
    if not mla or not any(_gpu(row).startswith(g) for g in BLACKWELL_GPUS):
        return "flash"
    return "math" if any(c in (row.get("container") or "") for c in TE_WITHOUT_BLACKWELL_MLA) else "flash"


def plan_recompute(stated: str, modules: tuple[str, ...]) -> str:
    """The plan's ``recompute`` for a row whose launch states ``modules`` (Megatron-core's
    ``--recompute-modules``) beside its ``stated`` recompute: ``core_attn`` is ``"selective"``; the
    other modules (``mla_up_proj``) live in the row's table (``moe_tables``)."""
    if stated == "none" and CORE_ATTN_MODULE in modules:
        return "selective"
    return stated
