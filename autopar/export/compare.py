"""The configuration a user runs today next to the best plan: "yours: 21.4 s, best: 17.9 s,
-16 %, because ...". Both sides are estimate results (docs/CONTRACTS.md, "Estimate result") scored
on the same model, hardware, GPUs and batch; the reason names the step-time terms
(``costmodels.contracts.breakdown``) that differ most and the plan fields that changed."""
from __future__ import annotations

from costmodels.contracts.breakdown import BREAKDOWN_KEYS, term_label
from costmodels.contracts.plan import PLAN_FIELDS
from costmodels.contracts.plans_file import PlanResult

SHOWN_TERMS = 2


def compare_estimates(yours: dict, best: dict) -> dict:
    """{yours_s, best_s, change (best/yours - 1), yours_label, best_label, fields_changed
    {field: [yours, best]}, terms [{term, label, yours_s, best_s}], text}."""
    y, b = float(yours["step_time_s"]), float(best["step_time_s"])
    change = b / y - 1.0 if y > 0 else 0.0
    diffs = sorted(((yours["breakdown_s"][k] - best["breakdown_s"][k], k) for k in BREAKDOWN_KEYS),
                   reverse=change <= 0)
    terms = [{"term": k, "label": term_label(k), "yours_s": yours["breakdown_s"][k],
              "best_s": best["breakdown_s"][k]}
             for d, k in diffs[:SHOWN_TERMS] if abs(d) > 0.01 * max(y, b)]
    fields = {f: [yours.get(f), best.get(f)] for f in PLAN_FIELDS
              if f != "stages" and yours.get(f) != best.get(f)}
    yours_label = PlanResult.from_dict(yours).plan.label()
    best_label = PlanResult.from_dict(best).plan.label()
    text = f"yours: {y:.4g} s, best: {b:.4g} s, {_percent(change)}"
    reasons = [f"{t['label']} {t['yours_s']:.3g} s -> {t['best_s']:.3g} s" for t in terms]
    if fields:
        reasons.append(", ".join(f"{f} {_show(a)} -> {_show(c)}" for f, (a, c) in fields.items()))
    elif yours.get("stages") != best.get("stages"):
        reasons.append("the split points moved")
    if not yours.get("fits", True):
        reasons.insert(0, "yours does not fit in memory")
    if reasons:
        text += ", because " + "; ".join(reasons)
    return {"yours_s": y, "best_s": b, "change": change, "yours_label": yours_label,
            "best_label": best_label, "fields_changed": fields, "terms": terms, "text": text}


def _percent(change: float) -> str:
    sign = "\u2212" if change < 0 else "+"
    return f"{sign}{abs(change) * 100:.0f} %"


def _show(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
