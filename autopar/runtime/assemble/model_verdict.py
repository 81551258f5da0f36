"""One answer to "can this model run tensor parallelism", for the commands that plan before the
runtime runs: ``inspect`` shows it, ``search`` proposes tp > 1 only when it is yes (a pinned
``--fix tp=N`` it cannot run fails with the runtime's own line), ``estimate`` refuses a tp plan
with it, and ``verify`` / ``apply`` reach the same line through ``check_before_launch``.

The answer is the runtime's pre-launch check itself (``prelaunch.check_before_launch``) on a
``meta`` build of the model under ``tp=2`` — the rewrite probe on each distinct row — so the
planner never proposes what the runtime refuses (a tied embedding split two ways,
nn.MultiheadAttention, convolutions) and proposes what it runs (Phi-3's fused qkv with
grouped-query heads, OLMo-2's q/k norms, BLOOM's ALiBi, DeBERTa's relative positions: the
rewrite's ``head_shards``).
Built-in models (``gpt:``, ``llama:`` …) are rewritten by construction and skip the probe.
Degree-dependent limits (heads, sequence) stay with the search's own rules.
"""
from __future__ import annotations

from functools import lru_cache

from costmodels.contracts.errors import AutoparError, PlanError


@lru_cache(maxsize=32)
def tp_refusal(spec: str, seq: int | None = None, leaf_modules: tuple = ()) -> str | None:
    """The runtime's one-line refusal of ``tp=2`` on model ``spec``, or None when it runs."""
    from autopar.models import load_model
    from autopar.runtime.assemble.prelaunch import check_before_launch
    from costmodels.contracts.plan import Plan
    source = load_model(spec, seq=seq)
    if source.config is not None:
        return None
    from autopar.trace.cut import shapes_only
    try:
        with shapes_only():
            check_before_launch(source.build("meta", seed=None), Plan(tp=2), spec=spec, seq=seq,
                                example_inputs=source.example_inputs(1, "cpu"), leaf_modules=leaf_modules,
                                allow_batch_statistics=True)
    except AutoparError as e:
        return str(e)
    return None


def refuse_tp(spec: str, tp: int, seq: int | None = None, leaf_modules: tuple = ()) -> None:
    """Raise the runtime's line for a plan with ``tp`` > 1 that this model cannot run."""
    if tp > 1 and (line := tp_refusal(spec, seq, tuple(leaf_modules))) is not None:
        raise PlanError(line.replace("'tp'=2", f"'tp'={tp}"))
