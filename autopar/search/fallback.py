"""The search's answer when its frontier has no plan in time: balanced splits, scored exactly.

``autopar.search.engine.run_search`` stops a frontier that has no plan at ``1 − FALLBACK_SHARE``
of ``--time-limit`` and calls ``balanced_fallback`` with the rest; the whole search, fallback
included, returns by the limit (the fallback used to run up to 60 s past it).
"""
from __future__ import annotations

import time

from autopar.search.frontier import Candidate, Frontier
from autopar.search.precision_space import search_precisions
from autopar.search.space import Config, Shape, configurations
from costmodels.contracts.errors import AutoparError

# the share of --time-limit kept for balanced_fallback: the frontier that has no plan by the rest of
# it stops there, one that has plans goes on to the limit
FALLBACK_SHARE = 0.2


def balanced_fallback(costs, shape: Shape, gpus: int, global_batch: int, fix: dict, allow_cross_node_tp: bool,
                      max_micro_batch: int | None, zero_bubble: bool, top: int, budget_s: float = 60.0,
                      deadline: float | None = None, frontier: Frontier | None = None) -> list:
    """When the deadline comes before CP-SAT has returned any split (the zero-bubble split
    programs at pp ≥ 8 can take minutes each), still answer: configurations in order of their
    bound, each on ``estimate``'s balanced split, for up to ``budget_s`` seconds and never past
    ``deadline`` (the search's own, ``--time-limit``: ``run_search`` keeps ``FALLBACK_SHARE`` of
    it for this), best ``top`` that fit (gpt3-175b pinned to interleaved-zb: 8220
    configurations, all in ~33 s; the first that fits is the 1843rd). With the ``frontier`` that
    ran out of time, its heap gives the order (no bound computed again: the quick bounds of
    deepseek-v3-like's 139,584 configurations took 70 s) and the plans it already scored (the
    seeds' min-max splits, ``Frontier._seed``) are candidates too. Scored exactly, but neither
    split-optimised nor proved: the result says ``optimal: false`` and each candidate's status
    is ``balanced-fallback``."""
    from costmodels.contracts.split import balanced_stages
    t0 = time.perf_counter()
    stop = t0 + budget_s if deadline is None else min(deadline, t0 + budget_s)
    best: dict = {}   # config -> (step time, plan, prediction), its best scored plan

    def offer(c, plan, pred) -> None:
        if pred.get("fits", True) and (c not in best or pred["step_time_s"] < best[c][0]):
            best[c] = (pred["step_time_s"], plan, pred)
    if frontier is not None:
        for plan, pred in frontier._evaluated.items():
            offer(Config.of(plan), plan, pred)
        configs = _heap_order(frontier)
    else:
        configs = _by_quick_bound(costs, shape, gpus, global_batch, fix, allow_cross_node_tp,
                                  max_micro_batch, zero_bubble, stop)
    for c in configs:
        if time.perf_counter() > stop:
            break
        try:
            plan = c.plan(balanced_stages(costs.table, c.pp * c.vpp))
            offer(c, plan, costs.evaluate(plan))
        except AutoparError:
            continue
    scored = sorted(((t, c, plan, pred) for c, (t, plan, pred) in best.items()), key=lambda x: x[0])
    out = [Candidate(c, plan, pred, t, "balanced-fallback") for t, c, plan, pred in scored[:top]]
    for i, cand in enumerate(out):
        cand.prediction["rank"] = i + 1
    return out


def _heap_order(frontier: Frontier) -> list:
    """The configurations on ``frontier``'s heap, each once, best key first."""
    seen, out = set(), []
    for entry in sorted(frontier.heap, key=lambda e: (e[0], e[1])):
        c = entry[3]
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _by_quick_bound(costs, shape: Shape, gpus: int, global_batch: int, fix: dict, allow_cross_node_tp: bool,
                    max_micro_batch: int | None, zero_bubble: bool, stop: float) -> list:
    """Every configuration by its quick bound, those bounded before ``stop`` (all, in time)."""
    keyed = []
    for c in configurations(shape, gpus, global_batch, costs.profile.link_domain, fix, allow_cross_node_tp,
                            max_micro_batch, zero_bubble, precisions=search_precisions(costs.profile, fix)):
        if time.perf_counter() > stop:
            break
        keyed.append((costs.quick_bound(c), len(keyed), c))
    return [c for _, _, c in sorted(keyed)]
