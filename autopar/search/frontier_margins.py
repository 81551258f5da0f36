"""The frontier's solve budgets and stopping margins, with the measurements that chose them
(split out of ``frontier``: each figure is a trade of CP-SAT time against re-solves, never of
exactness, since a stop only ends a solve early)."""
from __future__ import annotations

RETRY_FACTOR = 5
# CP-SAT stops once its bound passes the next entry's by this fraction (gpt3-175b, GPT-1T on
# bench_search_scale: 0 → 121 and 114 solves, 3.5 and 13 s; 1 % → 69 solves, 2.2 and 9.6 s;
# 3 % and 10 % slower again: each solve then proves more than the search needs). searchregress:
# 1 % → 5 %. fp8b's per-chunk dp sync (dp_sync_per_chunk) brought many interleaved layouts within
# a few % of each other while their level-1 bounds stay 5–12 % under their optima, so a 1 % stop
# deferred each of them 2–3 times on cheap (< 0.005 unit) solves whose cost is the program's
# build: 42 / 57 / 20 solves (gpt3-175b / llama3-405b / GPT 1T) → 23 / 31 / 15, the same plans.
# 4–7 % measured alike; not wider: at 12–20 % GPT 1T's stalling bounds took 9.4–9.5 units (25–27 s
# CPU) against 1.2–2.1 at 1–7 %.
STOP_MARGIN = 0.05   # a configuration CP-SAT did not prove gets a second solve this many times longer
# each time a configuration is deferred its margin grows this many times: one deferred again and
# again is one whose bound lies far under its optimum (a memory-bound split), and proving it past
# the next entry in 1 % steps re-solved it up to six times (gpt3-175b) — 259 of llama3-405b's 287
# solves were such re-solves. Any margin keeps the search exact: the stop only ends a solve early.
DEFER_GROWTH = 2.0
CHEAP_DEFERRAL = 0.05   # CP-SAT deterministic units (~0.1 s of a quiet core)
