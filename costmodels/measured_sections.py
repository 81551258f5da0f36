"""Parsers of the optional measured sections of a hardware profile (``costmodels/hardware.py``
documents the format): a curve such as ``[gpu.cross_entropy]`` and the per-collective
``[collectives.<kind>]`` alpha-beta fits ``autopar profile`` writes. Kept apart from the
required fields' parser so that each reads on its own; ``err`` is ``parse_profile``'s
ProfileError factory (it names the file and the field)."""
from __future__ import annotations

import math
from typing import Any

from costmodels.comm import MEASURED_KINDS


def curve_section(sect: dict[str, Any], name: str, keys: tuple[str, str], err, sources) -> tuple:
    """An optional measured curve ``[gpu.<name>]``: two equal-length lists of positive numbers,
    the first strictly increasing, and a source."""
    t = sect.get(name)
    if t is None:
        return (), ()
    full = f"gpu.{name}"
    if not isinstance(t, dict):
        raise err(full, "must be a table")
    xs, ys = t.get(keys[0]), t.get(keys[1])
    for key, v in ((keys[0], xs), (keys[1], ys)):
        if not isinstance(v, list) or not v or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in v):
            raise err(f"{full}.{key}", "must be a non-empty list of positive numbers")
    if len(xs) != len(ys):
        raise err(f"{full}.{keys[1]}", f"must have {len(xs)} entries (one per {keys[0]} entry)")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise err(f"{full}.{keys[0]}", "must be strictly increasing")
    if not isinstance(t.get("source"), str) or not t["source"].strip():
        raise err(full + ".source", "is missing or empty")
    sources[full] = t["source"]
    return tuple(float(x) for x in xs), tuple(float(y) for y in ys)


def collectives_section(data: dict[str, Any], err, sources: dict[str, str]) -> tuple:
    """The measured per-collective alpha-beta fits (``[collectives.<kind>]``), if any."""
    out = []
    colls = data.get("collectives", {})
    if not isinstance(colls, dict):
        raise err("collectives", "must be a table of [collectives.<kind>] tables")
    for kind, t in colls.items():
        full = f"collectives.{kind}"
        if kind not in MEASURED_KINDS:
            raise err(full, f"names no collective ({', '.join(MEASURED_KINDS)})")
        if not isinstance(t, dict):
            raise err(full, "must be a table")
        a, b = t.get("alpha_s"), t.get("beta_bytes_per_s")
        for key, x, lo in (("alpha_s", a, 0.0), ("beta_bytes_per_s", b, None)):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) \
                    or x < 0 or (lo is None and x <= 0):
                raise err(f"{full}.{key}", f"must be a {'positive' if lo is None else 'non-negative'} "
                          f"number, got {x!r}")
        if not isinstance(t.get("source"), str) or not t["source"].strip():
            raise err(full + ".source", "is missing or empty")
        sources[full] = t["source"]
        out.append((kind, float(a), float(b)))
    return tuple(out)
