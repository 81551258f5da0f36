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
    """A plans file (path or JSON text) as a dict; a bare list of plans or a single estimate result
    is wrapped so that ``explain`` can read what ``autopar estimate --json`` writes too."""
    data = read_json(source, what="plans")
    if isinstance(data, list):
        data = {"plans": data}
    elif isinstance(data, dict) and "plans" not in data:
        data = {"plans": [data]}
    if not isinstance(data, dict) or not isinstance(data.get("plans"), list) or not data["plans"]:
        raise PlanError(f"'{source}' holds no plans; write one with 'autopar search ... -o plans.json'")
    for i, p in enumerate(data["plans"]):
        if not isinstance(p, dict) or "step_time_s" not in p:
            raise PlanError(f"plan {i + 1} in '{source}' has no predictions (no 'step_time_s'); "
                            "explain reads files written by 'autopar search -o' or 'autopar estimate --json'")
    return data
