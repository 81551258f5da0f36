"""The plans file (docs/CONTRACTS.md "Plans file"), written atomically.

``{"version": 1, "model", "hardware", "gpus", "global_batch", "seq", "objective", "optimal",
"search_time_s", "plans": [{<estimate result>, "rank": 1}, ...]}`` — read by ``autopar report``,
the runtime (``Plan.load`` takes the first plan) and ``autopar explain``.
"""
from __future__ import annotations

import json
from typing import Any

from costmodels.errors import AutoparError, PlanError
from costmodels.files import write_text_atomic
from costmodels.plan import read_json

PLANS_FILE_VERSION = 1


def write_plans_file(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically: a temporary file in the same folder, fsync,
    then ``os.replace`` — a reader never sees half a file, and a failed write leaves the old one."""
    try:
        write_text_atomic(path, json.dumps(data, indent=2) + "\n", create_folder=False)
    except AutoparError as e:
        raise PlanError(str(e)) from None


def read_plans_file(source: str) -> dict[str, Any]:
    """A plans file (path or JSON text) as a dict ``{<header fields>, "plans": [...]}``; a bare
    list of plans or a single estimate result is wrapped, so ``explain`` reads what ``autopar
    estimate --json`` writes too. The checks are the report's (``autopar.report.load.parse``), so
    a missing or non-numeric prediction is one line naming the file, the plan and the field."""
    from autopar.report.load import load_json, parse
    if source.strip().startswith(("{", "[")):
        data, label = read_json(source, what="plans"), "<plans JSON>"
    else:
        data, label = load_json(source), source
    records = parse(data, label)
    header = data if isinstance(data, dict) and "plans" in data else {}
    out = {k: v for k, v in header.items() if k != "plans"}
    out["plans"] = [dict(r.data, rank=r.file_rank) for r in records]
    return out
