"""FP8 training in autopar's runtime: a plan with ``precision`` fp8 / fp8-rowwise / mxfp8 runs its
block linears through torchao (the pinned optional extra ``pip install -e '.[fp8]'``), composed as
torchtitan composes them (torchtitan/components/quantization/float8.py):

* the conversion runs on each rank's stage modules after the tensor-parallel rewrite (which
  leaves every shard an ordinary ``nn.Linear`` with explicit collectives around it, so each
  converted linear multiplies its local shard) and before data parallelism wraps them, so that
  FSDP2 (ZeRO-2/3) shards the float8 weights and, with ``fp8``, gathers them in FP8
  (``enable_fsdp_float8_all_gather``, what the cost model prices: costmodels/model/precision.py);
* only the transformer blocks' linears: the embedding and the LM head stay in BF16 (torchtitan's
  converter filters out ``output``), and a linear whose dimensions are not multiples of 16
  (``torch._scaled_mm``'s rule) stays in BF16;
* ``fp8``: dynamic tensorwise scaling; ``fp8-rowwise``: torchao's ``rowwise`` recipe (BF16
  all-gather); ``mxfp8``: torchao's MXFP8 training op (RCEIL scales) on Blackwell.

Before launch (``check_float8``, called by ``prelaunch.check_before_launch``) a plan the machine
cannot run is refused in one line: no CUDA GPU (a CPU run), a GPU without FP8 tensor cores (below
sm_89: A100, V100; MXFP8 needs sm_100), or torchao missing. Never run on a GPU in this session's
tests (none was lent); the CPU refusal is tested.
"""
from __future__ import annotations

import torch.nn as nn

from costmodels.contracts.errors import PlanError

NEEDS_CAPABILITY = {"fp8": (8, 9), "fp8-rowwise": (8, 9), "mxfp8": (10, 0)}
TORCHAO = "torchao==0.18.0"


def check_float8(plan) -> None:
    """Raise a one-line PlanError when this machine cannot train ``plan``'s precision."""
    p = getattr(plan, "precision", "bf16")
    if p == "bf16":
        return
    import torch
    if not torch.cuda.is_available():
        raise PlanError(f"plan field 'precision'='{p}' needs a CUDA GPU with FP8 tensor cores (H100, "
                        "H200, B200) and this machine has none; use precision='bf16' (autopar search "
                        "--fix precision=bf16)")
    need = NEEDS_CAPABILITY[p]
    cap = torch.cuda.get_device_capability()
    if tuple(cap) < need:
        raise PlanError(f"plan field 'precision'='{p}': {torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}) "
                        f"has no {'MXFP8' if p == 'mxfp8' else 'FP8'} tensor cores (needs sm_{need[0]}{need[1]} "
                        "or newer); use precision='bf16'")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise PlanError(f"plan field 'precision'='{p}' trains with torchao's float8 linears, which are "
                        f"not installed; pip install -e '.[fp8]' ({TORCHAO}) or use precision='bf16'") from None


def _convertible(mod: nn.Module) -> bool:
    return isinstance(mod, nn.Linear) and mod.in_features % 16 == 0 and mod.out_features % 16 == 0


def convert_stage(stage: nn.Module, plan) -> int:
    """Convert the block linears of one stage module in place (module docstring); returns how many
    linears were converted. ``stage.rows`` / ``stage.kinds``: the stage's layer-table rows."""
    p = getattr(plan, "precision", "bf16")
    if p == "bf16":
        return 0
    blocks = [row for row, kind in zip(stage.rows, stage.kinds) if kind == "block"]
    n = sum(_convertible(m) for row in blocks for m in row.modules())
    if p == "mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
        from torchao.quantization import quantize_
        config = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL)
        for row in blocks:
            quantize_(row, config, filter_fn=lambda m, fqn: _convertible(m))
        return n
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    if p == "fp8-rowwise":
        config = Float8LinearConfig.from_recipe_name("rowwise")
    else:
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=plan.zero >= 2 and plan.dp > 1)
    for row in blocks:
        convert_to_float8_training(row, config=config, module_filter_fn=lambda m, fqn: _convertible(m))
    return n


def precompute_scales(stages, plan) -> None:
    """After each optimizer step under FSDP2's FP8 all-gather: one all-reduce of every weight's
    amax instead of one per weight (torchtitan's ``precompute_float8_dynamic_scale_for_fsdp``)."""
    if getattr(plan, "precision", "bf16") != "fp8" or plan.zero < 2 or plan.dp < 2:
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
    for s in stages:
        precompute_float8_dynamic_scale_for_fsdp(s)
