"""Why a pooled plan splits the model the way it does: one line per pool, for top-k and explain.

Kept apart from ``pools`` (the search) because it only reads a finished plan: the blocks each
pool's stages run, the per-block time on each pool's hardware (the cost model's row time, the
same ``τ`` the split program balances), how close each pool's most loaded GPU is to its HBM,
and the GPUs left idle. E.g. ``h100-80g-sxm: 4 stages, 60 of 96 blocks (15 a stage); a block
takes 2.1× less time than on a100-80g-sxm``.
"""
from __future__ import annotations

import numpy as np

from costmodels.contracts.plan_pools import short_name


def split_reasons(table, cluster, cand, pc_costs) -> list[str]:
    plan, pred, c = cand.plan, cand.prediction, cand.config
    is_block = np.array([r.kind == "block" for r in table.rows])
    first_block = int(np.argmax(is_block)) if is_block.any() else 0
    total_blocks = int(is_block.sum())
    per_block = {q: float(pc_costs._row_s(q, c)[first_block]) for q in set(plan.stage_pools)}
    slowest = max(per_block, key=per_block.get)
    lines = []
    details = pred.get("stages_detail") or []
    for q, pool in enumerate(cluster.pools):
        ranks = [r for r, p in enumerate(plan.stage_pools) if p == q]
        name = short_name(pool.name)
        if not ranks:
            lines.append(f"{name}: unused ({pool.gpus} GPUs idle): adding its stages does not shorten the step")
            continue
        blocks = [int(is_block[plan.stages[r][0]:plan.stages[r][1]].sum()) for r in ranks]
        text = (f"{name}: {len(ranks)} stage(s), {sum(blocks)} of {total_blocks} blocks "
                f"({min(blocks)}–{max(blocks)} a stage)" if min(blocks) != max(blocks) else
                f"{name}: {len(ranks)} stage(s), {sum(blocks)} of {total_blocks} blocks ({blocks[0]} a stage)")
        if q != slowest and per_block[q] > 0:
            text += (f"; a block takes {per_block[slowest] / per_block[q]:.2f}× less time than on "
                     f"{short_name(cluster.pools[slowest].name)}")
        mems = [details[r]["memory_bytes"]["total"] / pool.profile.hbm_bytes for r in ranks if r < len(details)]
        if mems and max(mems) > 0.9:
            text += f"; memory-bound (a stage at {100 * max(mems):.0f} % of its {pool.profile.hbm_bytes / 1e9:.0f} GB)"
        idle = pool.gpus - len(ranks) * plan.tp * plan.dp
        if idle:
            text += f"; {idle} of {pool.gpus} GPUs idle (not a whole tp·dp = {plan.tp * plan.dp} stage)"
        lines.append(text)
    return lines
