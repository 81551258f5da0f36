"""A memory bound that knows every virtual stage holds a row: interleaved MoE layouts that no
split fits are dropped before CP-SAT.

``Terms.memory_lower_bound`` charges each rank its activations at the *smallest* in-flight count
among its stages and lets rows go in pieces to whichever rank is cheapest. Under interleaved 1F1B
a rank's first chunk holds up to pp + … micro-batches and its last one 1, so the bound sees every
rank as nearly free: deepseek-v3-like on 1024 H100, FP8 dp256·pp4 vpp8 ep8 ZeRO-3 full
recompute, bounds 77 GiB while every split needs more than 140 GiB in the split program
(``split_memory``), and CP-SAT spent its whole limit (2–9 s, three tries per configuration) on
such layouts without finding a split or proving none, so the search could not prove anything.

The split program's memory of rank r (``split_memory.add_memory``) is
``R + Σ_{v ∈ r} Σ_{i ∈ v} (σ_i + φ_v α_i) + w·[r holds a block] + top2_r`` with ``top2_r`` (ZeRO-3)
the weights of its two largest rows. Every stage v holds at least its first row, whose index
``a_v`` lies in ``[v, n − S + v]`` (S stages, each non-empty, in order), so

* stage v costs at least ``c_v = min_{i ∈ [v, n−S+v]} (σ_i + φ_v α_i)``;
* rank r holds a block whenever one of its stages' ranges is all blocks (``w`` is then due);
* its two largest rows weigh at least the two largest of its stages' smallest first rows;
* of the other ``n − S`` rows, at least ``n − S − (n − n_c)`` belong to any class c of ``n_c``
  equal rows (σ_c, α_c); each costs at least ``e_r = σ_c + min_{v ∈ r} φ_v α_c`` on rank r, and
  rows are whole: the least ``max_r (F_r + k_r e_r)`` over counts with ``Σ k_r = n − S − (n −
  n_c)``, each row to the rank it leaves lowest (a MoE table's 58 equal MoE rows of 63
  decide it; charging every extra row at the cheapest row's price let the embedding and dense
  rows stand in for all of them);
* those rows are ``n − S`` distinct rows, so together they cost at least the ``n − S`` smallest
  of ``ρ_i = min_v (σ_i + φ_v α_i)``, ``X``; the most loaded rank holds at least the mean
  ``(Σ_r F_r + X) / pp`` (a MoE table has few cheap rows: the water-filling alone charges every
  extra row at the price of the embedding).

So ``max_r M_r ≥ R + max(max_r F_r, L, (Σ_r F_r + X)/pp)`` with ``F_r`` the rank's forced part; nothing here rounds
up, and the program rounds bytes up, so a configuration above HBM here has no split the program
accepts. Not for the split-backward schedules (their peaks are several moments: ``Terms.states``).
"""
from __future__ import annotations

import numpy as np


def stage_memory_bound(terms) -> float:
    """A lower bound on the most loaded rank's memory in the split program (module docstring);
    ``terms.reserve`` where it does not apply."""
    if terms.states is not None:
        return terms.reserve
    co = terms.coef
    if terms.n_virtual > terms.n:
        return terms.reserve
    block = np.asarray(co.is_block, bool)
    w = float(np.max(co.act_none_bytes[block])) if (terms.full_recompute and block.any()) else 0.0
    return _rank_bound(terms, np.asarray(co.state_bytes, float), np.asarray(co.weight_bytes, float), w)


def estimate_stage_bound(costs, c, terms) -> float:
    """The same bound on ``estimate``'s memory of the most loaded GPU (what decides whether a plan
    fits): its per-row states and ZeRO-3 gathered rows read off ``memory.stage_memory`` and
    ``experts.fix_stage_memory`` one row at a time (linear where no row's value is clipped at 0,
    checked: else the bound is left out), its activations the program's (``row_coefficients``,
    which ``estimate`` reads too), and no recompute working set. Both gather a MoE row's local ep
    shard under ZeRO-3 (deepseek-v3-like at ep8: 6.2 GiB for two rows; the estimate charged every
    expert, 42.9 GiB, before ``fix_stage_memory`` fixed it), so the two now differ only where the
    estimate's clipping at 0 does. ``c``: the configuration as searched (cp unfolded)."""
    if terms.states is not None or terms.n_virtual > terms.n:
        return terms.reserve
    cache = costs.__dict__.setdefault("_estimate_rows", {})
    key = (c.tp, c.dp, c.cp, c.zero, c.ep, c.etp, c.dp_shard, c.runtime, c.precision)
    if key not in cache:
        cache[key] = _estimate_rows(costs, c)
    if cache[key] is None:
        return terms.reserve
    states, gathered = cache[key]
    return _rank_bound(terms, states, gathered, 0.0)


def _estimate_rows(costs, c):
    """(states, gathered) per row as ``estimate`` charges them, None where a row's is clipped."""
    from costmodels.model.allocator import as_allocated
    from costmodels.model.context_parallel import zero_group
    from costmodels.model.experts import fix_stage_memory
    from costmodels.model.memory import stage_memory
    from costmodels.profiles.runtime import load_runtime
    _table, arr, pc = costs.priced(c)
    rt = load_runtime(pc.runtime)
    states, gathered = np.zeros(arr.n), np.zeros(arr.n)
    for i in range(arr.n):
        mem = stage_memory(arr, [(i, i + 1)], tp=pc.tp, dp=zero_group(pc), zero=pc.zero,
                           sp=pc.sequence_parallel, b=pc.micro_batch_size, recompute=pc.recompute,
                           attention=pc.attention, inflight=[0], reserve=0.0, act_rows=np.zeros(arr.n),
                           precision="bf16-mixed")
        mem = as_allocated(fix_stage_memory(mem, arr, [(i, i + 1)], pc, "bf16-mixed"), rt, "bf16-mixed")
        if arr.params[i] > 0 and min(mem["params"], mem["grads"], mem["optimizer"]) <= 0.0:
            return None   # a clipped row: its value is not its share of a rank's
        states[i] = mem["params"] + mem["grads"] + mem["optimizer"]
        gathered[i] = mem["gathered"]
    return states, gathered


def _rank_bound(terms, sigma: np.ndarray, weight: np.ndarray, w: float) -> float:
    """The module docstring's bound for per-row states ``sigma``, ZeRO-3 buffer ``weight`` (two
    largest per rank) and recompute working set ``w``; activations ``terms.coef.act_bytes``."""
    co = terms.coef
    n, S = terms.n, terms.n_virtual
    alpha = np.asarray(co.act_bytes, float)
    block = np.asarray(co.is_block, bool)
    # stage v's first row lies in the window [v, n − S + v]: all S windows at once (dense: the
    # loop over stages was a third of gpt3-175b's bounding time), the same values as one by one
    window = np.arange(S)[:, None] + np.arange(n - S + 1)[None, :]
    phi_v = np.asarray(terms.inflight[:S], float)[:, None]
    first = (sigma[window] + phi_v * alpha[window]).min(axis=1).tolist()
    forced_block = block[window].all(axis=1).tolist()
    first_weight = weight[window].min(axis=1).tolist()
    F, phi_min = [], []
    for r in range(terms.pp):
        vs = terms.stages_of(r)
        f = sum(first[v] for v in vs)
        if w and any(forced_block[v] for v in vs):
            f += w
        if terms.zero3_buffer:
            f += sum(sorted((first_weight[v] for v in vs), reverse=True)[:2])
        F.append(f)
        phi_min.append(min(terms.inflight[v] for v in vs))
    F_arr, phi = np.array(F), np.array(phi_min, dtype=float)
    level = max(F)
    # the other n − S rows: of a class of n_c equal rows (σ, α), at least n − S − (n − n_c) are
    # among them, each on rank r at σ + min_{v ∈ r} φ_v α or more (water-filling over the ranks)
    classes: dict = {}
    for s_i, a_i in zip(sigma.tolist(), alpha.tolist()):
        classes[(s_i, a_i)] = classes.get((s_i, a_i), 0) + 1
    for (s_c, a_c), n_c in classes.items():
        need = (n - S) - (n - n_c)
        if need > 0:
            level = max(level, _water_level(F_arr, s_c + phi * a_c, need))
    # those n − S rows together cost at least the n − S smallest of each row's cheapest cost
    # anywhere, shared by the pp ranks (the most loaded holds the mean or more)
    rho = np.sort(np.min(sigma[:, None] + np.asarray(terms.inflight, float)[None, :] * alpha[:, None], axis=1))
    level = max(level, (sum(F) + float(rho[: n - S].sum())) / terms.pp)
    return terms.reserve + level


def _water_level(F: np.ndarray, e: np.ndarray, extra: int) -> float:
    """The least possible max_r (F_r + k_r·e_r) over whole row counts k_r ≥ 0 with Σ k_r = extra
    (rows are not cut in the program): each row in turn to the rank it leaves lowest, exact for
    equal rows; 0 where a rank takes rows for free."""
    if extra <= 0 or np.any(e <= 0):
        return 0.0
    import heapq
    heap = [(float(f + c), float(c)) for f, c in zip(F, e)]
    heapq.heapify(heap)
    level = 0.0
    for _ in range(extra):
        load, c = heapq.heappop(heap)
        level = max(level, load)
        heapq.heappush(heap, (load + c, c))
    return level
