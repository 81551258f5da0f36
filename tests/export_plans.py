"""Plans and a context shared by the export tests: a spread over dp / tp / pp / vpp, ZeRO 0-3,
recompute modes, even, uneven-end and layout-only splits, schedules, placements and attention."""
from __future__ import annotations

from autopar.export import context_for
from autopar.export.stages import stages_from_counts
from costmodels.contracts.plan import Plan

MODEL = "gpt:layers=8,hidden=256,heads=8,vocab=4096,seq=256"
ROWS = 10                                   # embedding, 8 blocks, head
GLOBAL_BATCH = 64


def ctx_for(plan: Plan):
    return context_for(MODEL, gpus=plan.world_size, global_batch=GLOBAL_BATCH, gpus_per_node=4)


def split(*counts):
    return stages_from_counts(list(counts), ROWS, "test")


SPREAD = [
    Plan(dp=8, stages=split(8)),
    Plan(dp=8, zero=1, recompute="selective", stages=split(8)),
    Plan(dp=8, zero=2, recompute="full", micro_batch_size=2, stages=split(8)),
    Plan(dp=8, zero=3, stages=split(8)),
    Plan(dp=2, tp=4, sequence_parallel=True, zero=1, stages=split(8)),
    Plan(dp=2, tp=2, pp=2, sequence_parallel=True, zero=1, recompute="selective", stages=split(4, 4)),
    Plan(dp=2, pp=4, stages=split(1, 3, 3, 1)),                        # uneven first / last
    Plan(dp=2, pp=4, stages=split(2, 2, 2, 2), zero=1, recompute="full"),
    Plan(dp=2, pp=4, stages=split(3, 1, 2, 2)),                        # only a layout / FQNs say it
    Plan(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", stages=split(2, 2, 2, 2)),
    Plan(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", stages=split(1, 3, 3, 1), zero=2),
    Plan(tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", sequence_parallel=True, stages=split(0, 3, 3, 2)),
    Plan(dp=4, pp=2, schedule="gpipe", stages=split(4, 4), zero=2),
    Plan(dp=2, tp=2, pp=2, placement="tp,pp,dp", stages=split(4, 4)),
    Plan(dp=2, tp=2, pp=2, placement="dp,tp,pp", stages=split(4, 4)),
    Plan(dp=4, tp=2, attention="math", stages=split(8)),
    Plan(dp=2, pp=4, zero=3, stages=split(2, 2, 2, 2)),
]
