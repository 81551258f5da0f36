"""The frontier's values and orderings: a candidate plan, the search's counters, and the keys
that order configurations and plans under each objective (``objective_key``) and the step times a
split must beat (``_step_bound``, ``_step_to_beat``). Apart from ``Frontier`` so that the search's
other parts (engine, pools, fallback) read them without the heap's machinery.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autopar.search.space import Config


@dataclass
class Candidate:
    config: Config
    plan: Any                       # costmodels.contracts.plan.Plan with explicit stages
    prediction: dict                # estimate(...).to_dict() plus rank
    solver_objective_s: float       # a·T + k from the integer model
    status: str                     # CP-SAT status of its split


@dataclass
class SearchStats:
    configurations: int = 0
    bounded: int = 0                # full terms computed
    pruned_memory: int = 0          # dropped: memory bound above HBM
    pruned_target: int = 0          # dropped: cannot reach the target (fewest_gpus)
    pruned_bound: int = 0           # CP-SAT proved no split beats the k-th plan found
    solved: int = 0                 # CP-SAT runs
    infeasible: int = 0             # CP-SAT proved no split fits
    not_proved: int = 0             # CP-SAT stopped before proving
    exact_resolves: int = 0         # split-backward schedules solved again with the exact program
    deferred: int = 0               # CP-SAT stopped once its bound passed the next entry's
    solver_s: float = 0.0
    solver_det: float = 0.0         # CP-SAT's deterministic time over all solves (load-free)
    evaluator_s: float = 0.0
    memory_floored: int = 0         # put back unsolved by the bound that sees memory (memory_blocks)
    ties_merged: int = 0            # plans shown once: same layout, other ZeRO stage, same step time
    exact_splits: int = 0           # zero-bubble splits by branch-and-bound (issue 30: zb_exact)
    exact_nodes: int = 0            # its nodes, all configurations together
    count_splits: int = 0           # srch7: optimal by a block-count split at the level-1 bound (block_counts)


def _ties(a: tuple, b: tuple) -> bool:
    """Two objective keys equal to rounding."""
    return all(abs(x - y) <= 1e-9 * max(abs(x), abs(y)) for x, y in zip(a, b))


def same_but_zero(a: Candidate, b: Candidate) -> bool:
    """Two plans that differ only in their ZeRO stage (and the split that goes with it) and take
    the same step time: where the stage cannot matter to the user but for memory."""
    ta, tb = a.prediction["step_time_s"], b.prediction["step_time_s"]
    return (a.config.zero != b.config.zero and replace(a.config, zero=0) == replace(b.config, zero=0)
            and abs(ta - tb) <= 1e-9 * max(ta, tb))


def objective_key(objective: str, config: Config, step_time: float) -> tuple:
    """The sort key of a plan of ``config`` taking ``step_time`` (smaller is better): the step
    time, the GPU-seconds per step, or the GPU count then the step time."""
    if objective == "throughput_per_gpu":
        return (step_time * config.gpus,)
    if objective == "fewest_gpus":
        return (config.gpus, step_time)
    return (step_time,)


def _step_bound(objective: str, c: Config, exact_keys: list, top: int, target: float | None):
    """The step time a split of ``c`` must beat to enter the top ``top`` (None: no bound yet)."""
    bound = target
    if len(exact_keys) >= top:
        kth = exact_keys[top - 1]
        if objective == "throughput_per_gpu":
            b = kth[0] / c.gpus
        elif objective == "fewest_gpus":
            if c.gpus < kth[0]:
                b = None
            elif c.gpus == kth[0]:
                b = kth[1]
            else:
                b = 0.0
        else:
            b = kth[0]
        if b is not None:
            bound = b if bound is None else min(bound, b)
    return bound


def _step_to_beat(objective: str, c: Config, key) -> float | None:
    """The step time above which a plan of ``c`` sorts after ``key`` (None: it never does)."""
    if objective == "throughput_per_gpu":
        return key[0] / c.gpus
    if objective == "fewest_gpus":
        return key[1] if key[0] == c.gpus else None
    return key[0]
