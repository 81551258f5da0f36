"""The plan checked against the model before its launch lines are written: the same pre-launch
check ``autopar.apply`` runs before ``init_process_group`` (``autopar.runtime.assemble.prelaunch``),
so that an export never writes a file whose launch fails on every rank — tp that does not divide
the heads, dp·micro-batch that does not divide the global batch, stages that miss the model's
last row or belong to another model.

The model is built on ``meta`` (no weights: the largest presets take a second); the rewrite is
probed only for autopar's own runtime (``torchrun``), whose rewrite is the one that will run."""
from __future__ import annotations

from costmodels.contracts.errors import AutoparError, PlanError


def check_against_model(plan, ctx, *, probe: bool = False) -> None:
    """Raise the one-line error ``apply`` would raise for ``plan`` on ``ctx.model`` (nothing
    when the context names no model: there is nothing to check against)."""
    if not ctx.model:
        return
    from autopar.models.spec import load_model
    from autopar.runtime.assemble.prelaunch import check_before_launch
    micro_batches = plan.num_micro_batches(ctx.global_batch) if ctx.global_batch else None
    source = load_model(ctx.model, seq=ctx.seq)
    try:
        check_before_launch(source.build_meta(), plan, num_micro_batches=micro_batches,
                            spec=ctx.model, seq=ctx.seq, probe=probe, on_this_machine=False)
    except AutoparError as e:
        raise PlanError(f"plan {plan.label()} cannot run on {ctx.model}: {e}") from None


def check_same_model(plans_model: str | None, given: str | None, source: str) -> None:
    """A plans file searched for one model, exported for another, is refused before any work."""
    if plans_model and given and plans_model != given:
        raise PlanError(f"{source} is a plans file for {plans_model}, not {given}: search {given} "
                        "for its own plans (its split points and batch are that model's)")
