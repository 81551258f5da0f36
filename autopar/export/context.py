"""What a launcher needs beside the plan: the model's shape, the GPU count, the batch, the node size.

A ``Plan`` says how to parallelise, not what is trained nor on how many machines (docs/CONTRACTS.md,
"Plan"); every launcher wants both. ``TrainingContext`` carries them, read from a plans file's
header (``context_from_plans_file``) or given by hand (``context_for``). Export and import read the
same context, so a plan exported with one comes back with it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from costmodels.contracts.errors import PlanError, SpecError

if TYPE_CHECKING:
    from autopar.models.config import ModelConfig
    from costmodels.contracts.plan import Plan

DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class TrainingContext:
    """``model``: the MODEL spec; ``config``: its ``ModelConfig`` (None for user code / hf);
    ``n_rows``: layer-table rows (embedding, blocks, head); ``gpus``, ``global_batch``, ``seq``:
    the training job; ``gpus_per_node``: for the launch lines; ``hardware``: where it came from."""
    model: str | None = None
    config: ModelConfig | None = None
    n_rows: int | None = None
    gpus: int | None = None
    global_batch: int | None = None
    seq: int | None = None
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    hardware: str | None = None

    @property
    def n_blocks(self) -> int:
        """Transformer blocks (the rows between the embedding and the head)."""
        if self.n_rows is None:
            raise SpecError("the number of model layers is unknown; give MODEL (a preset or family "
                            "spec) so the layer count can be read")
        return self.n_rows - 2

    def with_(self, **changes) -> TrainingContext:
        return replace(self, **changes)

    def need(self, name: str, flag: str):
        """The context field ``name``, or a PlanError saying which option supplies it."""
        value = getattr(self, name)
        if value is None:
            raise PlanError(f"the {name.replace('_', ' ')} is unknown: give {flag}")
        return value


def context_for(model: str | None, *, seq: int | None = None, gpus: int | None = None,
                global_batch: int | None = None, hardware: str | None = None,
                gpus_per_node: int | None = None, table=None) -> TrainingContext:
    """A context for MODEL. Presets and families are read from their spec (no trace); user code and
    hf models are traced once for their row count (``table`` skips that)."""
    config, n_rows = None, None
    if model:
        from autopar.models.spec import load_model
        source = load_model(model, seq=seq)
        config = source.config
        seq = seq if seq is not None else source.seq
        if table is not None:
            n_rows = len(table.rows)
        elif config is not None and config.family in ("gpt", "llama", "bert", "vit", "mlp"):
            n_rows = config.layers + 2
        else:
            from autopar.trace import table_for
            n_rows = len(table_for(model, micro_batch=1, seq=seq).rows)
    if gpus_per_node is None:
        gpus_per_node = _gpus_per_node(hardware)
    return TrainingContext(model=model, config=config, n_rows=n_rows, gpus=gpus,
                           global_batch=global_batch, seq=seq, gpus_per_node=gpus_per_node,
                           hardware=hardware)


def context_from_plans_file(plans_file, index: int, *, model: str | None = None,
                            gpus_per_node: int | None = None) -> TrainingContext:
    """The context of plan ``index`` of a read ``PlansFile``: its model, GPUs (the plan's own
    ``gpus`` where it says, else dp·tp·pp), global batch, sequence length and hardware."""
    result = plans_file.results[index]
    plan = result.plan
    spec = model or result.values.get("model") or plans_file.model
    seq = result.values.get("seq") or plans_file.seq
    global_batch = result.values.get("global_batch") or plans_file.global_batch
    hardware = result.values.get("hardware") or plans_file.hardware
    return context_for(spec, seq=seq, gpus=plan.world_size, global_batch=global_batch,
                       hardware=hardware, gpus_per_node=gpus_per_node)


def resolve_stages(plan: Plan, ctx: TrainingContext) -> tuple[tuple[int, int], ...]:
    """The plan's split points; without any, the balanced split the cost model and the runtime
    use (``costmodels.contracts.split.balanced_stages`` on the model's traced table)."""
    n_rows = ctx.n_rows
    if plan.stages is not None:
        if n_rows is not None and plan.stages[-1][1] != n_rows:
            raise PlanError(f"plan field 'stages' ends at row {plan.stages[-1][1]} but {ctx.model} has "
                            f"{n_rows} rows (embedding, {n_rows - 2} blocks, head); use a plan made for "
                            "this model")
        return plan.stages
    if plan.pp * plan.vpp == 1:
        return ((0, ctx.need("n_rows", "MODEL")),)
    from autopar.trace import table_for
    from costmodels.contracts.split import balanced_stages
    model = ctx.need("model", "MODEL")
    return balanced_stages(table_for(model, micro_batch=1, seq=ctx.seq), plan.pp * plan.vpp)


def _gpus_per_node(hardware: str | None) -> int:
    if not hardware:
        return DEFAULT_GPUS_PER_NODE
    from costmodels.contracts.errors import ProfileError
    from costmodels.profiles.hardware_files import load_profile
    try:
        return int(load_profile(hardware).gpus_per_node)
    except ProfileError:
        return DEFAULT_GPUS_PER_NODE
