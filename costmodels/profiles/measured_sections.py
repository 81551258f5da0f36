"""Parsers of the optional measured sections of a hardware profile (``costmodels/profiles/hardware.py``
documents the format): a curve such as ``[gpu.cross_entropy]`` and the per-collective
``[collectives.<kind>]`` alpha-beta fits ``autopar profile`` writes. Kept apart from the
required fields' parser so that each reads on its own; ``err`` is ``parse_profile``'s
ProfileError factory (it names the file and the field)."""
from __future__ import annotations

from typing import Any

from costmodels.contracts.checks import quote
from costmodels.profiles.profile_checks import check_points, check_range
from costmodels.profiles.topology import MEASURED_KINDS


def curve_section(sect: dict[str, Any], name: str, keys: tuple[str, str], err, sources) -> tuple:
    """An optional measured curve ``[gpu.<name>]``: two equal-length lists of positive numbers,
    the first strictly increasing, and a source."""
    t = sect.get(name)
    if t is None:
        return (), ()
    full = f"gpu.{name}"
    if not isinstance(t, dict):
        raise err(full, "must be a table")
    xy = _points(t, keys, full, err)
    if not isinstance(t.get("source"), str) or not t["source"].strip():
        raise err(full + ".source", "is missing or empty")
    sources[full] = t["source"]
    return xy


def collectives_section(data: dict[str, Any], err, sources: dict[str, str]) -> tuple[tuple, tuple]:
    """The measured per-collective alpha-beta fits (``[collectives.<kind>]``), if any: the
    in-step fit (``in_step_alpha_s`` / ``in_step_beta_bytes_per_s``) where the profile has one,
    else the back-to-back one; and the measured in-step points (``in_step_bytes`` /
    ``in_step_seconds`` over ``ranks`` ranks) as curves ``(kind, ranks, bytes, seconds)``."""
    out, curves = [], []
    colls = data.get("collectives", {})
    if not isinstance(colls, dict):
        raise err("collectives", "must be a table of [collectives.<kind>] tables")
    for kind, t in colls.items():
        full = f"collectives.{kind}"
        if kind not in MEASURED_KINDS:
            raise err(quote(full, 60).strip("'"), f"names no collective ({', '.join(MEASURED_KINDS)})")
        if not isinstance(t, dict):
            raise err(full, "must be a table")
        a, b = _alpha_beta(t, "", full, err)
        if not isinstance(t.get("source"), str) or not t["source"].strip():
            raise err(full + ".source", "is missing or empty")
        sources[full] = t["source"]
        if any(k.startswith("in_step_") for k in t):
            # its time between compute, as a step issues it: the figure the cost model prices
            a, b = _alpha_beta(t, "in_step_", full, err)
            if not isinstance(t.get("in_step_source"), str) or not t["in_step_source"].strip():
                raise err(full + ".in_step_source", "is missing or empty")
            sources[full + ".in_step"] = t["in_step_source"]
            if "in_step_bytes" in t or "in_step_seconds" in t:
                curves.append((kind, _ranks(t, full, err))
                              + _points(t, ("in_step_bytes", "in_step_seconds"), full, err))
        out.append((kind, a, b))
    return tuple(out), tuple(curves)


def _ranks(t: dict, full: str, err) -> int:
    r = t.get("ranks")
    if isinstance(r, bool) or not isinstance(r, int):
        raise err(full + ".ranks", f"must be the number of ranks measured (an integer >= 2), got {quote(r)}")
    return int(check_range(r, full + ".ranks", "ranks", err, integer=True))


def _points(t: dict, keys: tuple[str, str], full: str, err) -> tuple[tuple, tuple]:
    """Measured points ``t[keys[0]]`` -> ``t[keys[1]]``: two equal-length lists of positive
    numbers in their plausible ranges (``costmodels.profiles.profile_checks.RANGES``), the first strictly
    increasing."""
    xs, ys = t.get(keys[0]), t.get(keys[1])
    for key, v in ((keys[0], xs), (keys[1], ys)):
        check_points(v, key.removeprefix("in_step_"), f"{full}.{key}", err)
    if len(xs) != len(ys):
        raise err(f"{full}.{keys[1]}", f"must have {len(xs)} entries (one per {keys[0]} entry)")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise err(f"{full}.{keys[0]}", "must be strictly increasing")
    return tuple(float(x) for x in xs), tuple(float(y) for y in ys)


def _alpha_beta(t: dict, prefix: str, full: str, err) -> tuple[float, float]:
    return (check_range(t.get(prefix + "alpha_s"), f"{full}.{prefix}alpha_s", "alpha_s", err),
            check_range(t.get(prefix + "beta_bytes_per_s"), f"{full}.{prefix}beta_bytes_per_s",
                        "beta_bytes_per_s", err))
