"""The split program's communication terms (sections 3 and 5 of ``autopar.search.split_model``):
pipeline p2p and exposed ZeRO-3 gathers per virtual stage, then the exposed data-parallel sync
and the optimizer step. Kept apart from the model's time and objective sections, as the memory
family is (``split_memory``); each function adds its variables and constraints to the model
``sm`` it is given."""
from __future__ import annotations

from costmodels.contracts.plan import V_SCHEDULES


def add_communication(sm) -> None:
    """Section 3: the p2p time of each virtual stage's cuts (none at the V's turn) and the
    exposed ZeRO-3 gathers per stage (``sm.Q``, ``sm.Z``)."""
    t, md, S = sm.t, sm.model, sm.S
    sm.Q = [0] * S
    if sm.pp > 1:   # the activation out of a cut and its gradient back: the same p2p time
        send = sm._at("sd", sm._ns(sm.co.cut_p2p_s))
        grad = sm._at("gr", sm._ns(sm.co.cut_p2p_s))
        turn = sm.pp - 1 if sm.t.config.schedule in V_SCHEDULES else None   # V: no send at the turn
        for v in range(S):
            q = 0
            if v < S - 1 and v != turn:
                q = q + send[v + 1]
            if v > 0 and (turn is None or v != turn + 1):
                q = q + grad[v]
            sm.Q[v] = q
    sm.Z = [0] * S
    if t.zero3_gathers:   # coefficients docstring: max(EF + s·Σgf, Σgf − Σf) + the same backward
        co = sm.co
        big = sum(sm._ns(co.zero_fwd_s)) + sum(sm._ns(co.zero_bwd_s)) + 1
        ef = sm._at("ef", sm._ns(co.zero_first_fwd_s)) if not co.legacy else None
        eb = sm._at("eb", sm._ns(co.zero_first_bwd_s)) if not co.legacy else None
        for v in range(S):
            zf = md.NewIntVar(0, big, f"zf{v}")
            zb = md.NewIntVar(0, big, f"zb{v}")
            lo_f = 0 if co.legacy else ef[v] + sm.SF[v]
            lo_b = 0 if co.legacy else eb[v] + sm.SB[v]
            md.AddMaxEquality(zf, [lo_f, sm.Zf[v] - sm.F[v]])
            md.AddMaxEquality(zb, [lo_b, sm.Zb[v] - sm.Bz[v]])
            sm.Z[v] = zf + zb


def add_data_parallel(sm) -> None:
    """Section 5: the exposed data-parallel gradient sync (``sm.D``, the slowest rank's) and the
    optimizer step (``sm.O``)."""
    md, t, co = sm.model, sm.t, sm.co
    sm.D = 0
    if t.dp_sync:
        lat = int(round(co.dp_latency_s / sm.unit))
        # (+ the rounding of the runtime's split sums, 2 per row and 3 latencies)
        ub = sum(sm._ns(co.dp_per_param_s * co.params)) + lat + 2 * sm.n + 4
        exposed, before = [], 0
        for r in range(sm.pp):
            bk = sm._rank(sm.Bk, r)
            before = before + bk
            e = md.NewIntVar(0, ub, f"dx{r}")
            md.AddMaxEquality(e, [0, sm._rank(sm.Dt, r) + lat - before])
            if not co.legacy:   # max((1−s)·min(t, t_b) + s·t, t − W, 0) + the exposed after-part
                e = sm._dp_rank_cost(r, e, ub)
            exposed.append(e)
        ub += sum(sm._ns(co.dp_after_per_param_s * co.params)) + int(co.dp_after_latency_s / sm.unit) + 2
        sm.D = md.NewIntVar(0, ub, "D")
        md.AddMaxEquality(sm.D, exposed)
    ub = sum(sm._ns(co.optimizer_per_param_s * co.params)) + 1
    sm.O = md.NewIntVar(0, ub, "O")
    md.AddMaxEquality(sm.O, [sm._rank(sm.Ot, r) for r in range(sm.pp)])

def dp_rank_cost(sm, r: int, tail, ub: int):
    """Rank r's dp cost beyond ``tail`` = max(0, t − W) (coefficients docstring)."""
    md, co, u = sm.model, sm.co, sm.unit
    s_ = co.slowdown
    t1 = sm._rank(sm.Dt1, r) + int(round((1.0 - s_) * co.dp_latency_s / u))
    mn = md.NewIntVar(0, ub, f"dm{r}")
    md.AddMinEquality(mn, [t1, int(round((1.0 - s_) * co.dp_bucket_s / u))])
    head = md.NewIntVar(0, ub, f"dh{r}")
    md.AddMaxEquality(head, [tail, mn + sm._rank(sm.Dts, r) + int(round(s_ * co.dp_latency_s / u))])
    has = sm._has(sm._rank(sm.Pi, r), f"dpp{r}") if co.dp_after_latency_s else 0
    lat_a = int(round(co.dp_after_latency_s / u))
    return head + sm._rank(sm.Da, r) + lat_a * has
