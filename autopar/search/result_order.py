"""The top-k list once it is full: a plan that sorts before its last one still enters it.

Best-first, every plan popped after the top k are out sorts at or after the last of them, so the
frontier (``autopar.search.frontier``) used to drop any later plan. A second chance breaks that
order: ``Frontier._second_chance`` puts a configuration CP-SAT left unproved back on the heap at
its proved bound, under the last plan's key, and its solve may find a split that beats that plan
(GPT 1T on 3072 A100, with a 20 % stop margin: dp24·tp8·pp16 vpp4 mbs2, unproved at 65.6 s with a
split of 72.3 s, is 66.03 s — the second plan — once solved under the k-th plan's cut). Such a
plan replaces the last one, and the list stays sorted by objective key.

A second chance also re-solves a configuration whose first (unproved) split is already shown, or
still on the heap: the configuration then has two plans, and both entered the top k
(DeepSeek-V3-like on 1024 H100: dp256·pp4 vpp8 ZeRO-2 at 13.353 s and at 13.647 s, the second
pushing a distinct layout out). A configuration is one plan of the top k, at its best split:
``replace_own_plan`` keeps the faster of the two and drops the other.
"""
from __future__ import annotations

from autopar.search.frontier_keys import objective_key


def _key(objective: str, cand):
    return objective_key(objective, cand.config, cand.prediction["step_time_s"])


def replace_last_if_better(results: list, cand, objective: str) -> bool:
    """Put ``cand`` in place of the last of ``results`` (full, sorted) where its key sorts before
    that plan's, re-sorting the list; whether it entered."""
    if not results or not _key(objective, cand) < _key(objective, results[-1]):
        return False
    results[-1] = cand
    results.sort(key=lambda r: _key(objective, r))
    return True


def replace_own_plan(results: list, cand, objective: str) -> bool:
    """Where ``results`` already shows a plan of ``cand``'s configuration, keep the faster of the
    two (re-sorting the list); whether it did (the caller then adds nothing)."""
    for i, shown in enumerate(results):
        if shown.config == cand.config:
            if _key(objective, cand) < _key(objective, shown):
                results[i] = cand
                results.sort(key=lambda r: _key(objective, r))
            return True
    return False
