"""``--fix``: pinning plan fields before a search — parsing ``"tp=8,schedule=zb-v"`` (aliases,
torch's schedule class names, stage ranges) and the errors a pinned value makes certain before
any configuration is listed (degrees against ``--gpus``, a schedule against vpp, pp and the
runtime). Split out of ``autopar.search.space``, which lists the configurations a fix allows
and re-exports these names."""
from __future__ import annotations

from typing import Any

from costmodels.contracts.errors import AutoparError, PlanError
from costmodels.contracts.plan import (
    ATTENTION,
    MULTI_STAGE_SCHEDULES,
    PLACEMENTS,
    PLAN_FIELDS,
    RECOMPUTE,
    SCHEDULES,
    V_SCHEDULES,
)
from costmodels.contracts.runnable import divisors
from costmodels.profiles.runtime import load_runtime

ALIASES = {"mbs": "micro_batch_size", "micro_batch": "micro_batch_size", "micro-batch": "micro_batch_size",
           "micro_batch_size": "micro_batch_size", "sp": "sequence_parallel",
           "sequence-parallel": "sequence_parallel", "zero_stage": "zero", "virtual_stages": "vpp",
           "interleave": "vpp"}
# other spellings of the schedules, keyed by the name lower-cased without "-", "_" or spaces
# (torch's class names included: ScheduleZBVZeroBubble -> "zbvzerobubble" → zb-v)
SCHEDULE_ALIASES = {"interleaved": "interleaved-1f1b", "interleaved1f1b": "interleaved-1f1b",
                    "1f1b": "1f1b", "gpipe": "gpipe",
                    "zb": "interleaved-zb", "interleavedzb": "interleaved-zb",
                    "interleavedzerobubble": "interleaved-zb", "zerobubble": "interleaved-zb",
                    "zbv": "zb-v", "zbvzerobubble": "zb-v", "zerobubblev": "zb-v",
                    "dualpipev": "dualpipe-v"}
# the pools of a heterogeneous cluster are the search's to place (--hardware / --cluster), not pinned
FIX_FIELDS = tuple(f for f in PLAN_FIELDS if f not in ("pools", "stage_pools"))
TRUE = {"1", "true", "yes", "on", "y", "t"}
FALSE = {"0", "false", "no", "off", "n", "f"}


def parse_fix(text: str | None) -> dict[str, Any]:
    """``"tp=8,schedule=1f1b"`` → ``{"tp": 8, "schedule": "1f1b"}``.

    Any plan field may be pinned (aliases: ``mbs``/``micro_batch`` → ``micro_batch_size``,
    ``sp`` → ``sequence_parallel``). ``stages`` takes ``;``-separated half-open row ranges,
    ``stages=0:49;49:98``. A bad key or value raises ``PlanError`` with one line naming it.
    """
    out: dict[str, Any] = {}
    if not text:
        return out
    for item in _split_items(text):
        if not item.strip():
            continue
        if "=" not in item:
            raise PlanError(f"--fix item '{item}' is not key=value; write e.g. --fix tp=8,schedule=1f1b")
        key, raw = (s.strip() for s in item.split("=", 1))
        name = ALIASES.get(key, key)
        if name not in FIX_FIELDS:
            raise PlanError(f"--fix key '{key}' is not a plan field; allowed: {', '.join(FIX_FIELDS)} "
                            "(aliases mbs, sp)")
        if name in out:
            raise PlanError(f"--fix pins '{name}' twice; give it once")
        out[name] = _fix_value(name, raw)
    return out


def _split_items(text: str) -> list[str]:
    # "stages=0:49;49:98,tp=8" — commas separate items; stages uses ';' so it never holds a comma
    return text.split(",")


def _fix_value(name: str, raw: str) -> Any:
    def bad(allowed: str):
        return PlanError(f"--fix {name}={raw!r} is not valid: {name} must be {allowed}")
    if name in ("dp", "tp", "pp", "vpp", "micro_batch_size", "cp", "dp_shard"):
        try:
            v = int(raw)
        except ValueError:
            raise bad("a positive integer") from None
        if v < 1:
            raise bad("a positive integer")
        return v
    if name == "zero":
        if raw not in ("0", "1", "2", "3"):
            raise bad("0, 1, 2 or 3")
        return int(raw)
    if name == "sequence_parallel":
        if raw.lower() in TRUE:
            return True
        if raw.lower() in FALSE:
            return False
        raise bad("true or false")
    if name == "recompute":
        if raw not in RECOMPUTE:
            raise bad(" / ".join(RECOMPUTE))
        return raw
    if name == "schedule":
        return schedule_name(raw, bad)
    if name == "attention":
        if raw not in ATTENTION:
            raise bad(" / ".join(ATTENTION))
        return raw
    if name == "runtime":
        try:
            return load_runtime(raw).name
        except AutoparError as e:
            raise PlanError(f"--fix runtime={raw!r}: {e}") from None
    if name == "placement":
        raw2 = raw.replace("/", ",").replace("+", ",").replace("-", ",")
        if raw2 not in PLACEMENTS:
            raise bad(" / ".join(p.replace(",", "-") for p in PLACEMENTS) + " (e.g. placement=tp-dp-pp)")
        return raw2
    if name == "precision":   # the matmuls' number format (costmodels.model.precision)
        from costmodels.contracts.plan import PRECISIONS
        if raw not in PRECISIONS:
            raise bad(" / ".join(PRECISIONS))
        return raw
    if name == "stages":
        if raw in ("balanced", "none", "None"):
            return None
        try:
            ranges = []
            for part in raw.split(";"):
                a, b = part.split(":")
                ranges.append((int(a), int(b)))
        except ValueError:
            raise bad("';'-separated half-open row ranges, e.g. stages=0:49;49:98") from None
        return tuple(ranges)
    raise bad("a plan value")  # pragma: no cover


def schedule_name(raw: str, bad) -> str:
    """The plan's schedule name for ``raw`` (a plan name or an alias, any case; torch's class
    names too), else ``bad(allowed)`` raised."""
    if raw in SCHEDULES:
        return raw
    key = "".join(ch for ch in raw.lower() if ch not in "-_ ")
    if key.startswith("schedule"):
        key = key[len("schedule"):]
    if key in SCHEDULE_ALIASES:
        return SCHEDULE_ALIASES[key]
    hint = (" (DualPipe's two-way pipeline is not planned; its V form is dualpipe-v)"
            if key == "dualpipe" else "")
    raise bad(" / ".join(SCHEDULES) + hint)


def check_fix_against(fix: dict[str, Any], gpus: int | None) -> None:
    """Errors a pinned value makes certain before any search (one line each)."""
    if gpus is not None:
        prod = 1
        for k in ("dp", "cp", "tp", "pp"):
            if k in fix:
                prod *= fix[k]
                if gpus % fix[k]:
                    raise PlanError(f"--fix {k}={fix[k]} does not divide --gpus {gpus}; "
                                    f"choose {k} in {divisors(gpus)}")
        if gpus % prod:
            raise PlanError(f"--fix dp·cp·tp·pp = {prod} does not divide --gpus {gpus}")
        if all(k in fix for k in ("dp", "tp", "pp")) and prod != gpus:
            raise PlanError(f"--fix dp·cp·tp·pp = {prod} but --gpus is {gpus}; they must be equal")
        if "dp_shard" in fix and "dp" in fix and fix["dp"] % fix["dp_shard"]:
            raise PlanError(f"--fix dp_shard={fix['dp_shard']} must divide dp={fix['dp']} (HSDP's "
                            f"shard group); choose dp_shard in {divisors(fix['dp'])}")
    _check_fix_schedule(fix)


def _check_fix_schedule(fix: dict[str, Any]) -> None:
    """A pinned schedule against the pinned vpp, pp and runtime (``costmodels.contracts.plan``'s rules:
    several stages per rank need a multi-stage schedule and pp ≥ 2, the V schedules exactly two)."""
    sched, vpp = fix.get("schedule"), fix.get("vpp")
    if vpp is not None and vpp > 1 and sched is not None and sched not in MULTI_STAGE_SCHEDULES:
        raise PlanError(f"--fix vpp={vpp} needs a schedule with several stages per rank "
                        f"({', '.join(MULTI_STAGE_SCHEDULES)}), not schedule={sched}")
    if sched is None:
        return
    if sched in MULTI_STAGE_SCHEDULES and vpp == 1:
        raise PlanError(f"--fix schedule={sched} runs several stages per rank: it needs vpp >= 2 "
                        "(drop vpp=1 from --fix)")
    if sched in V_SCHEDULES and vpp is not None and vpp != 2:
        raise PlanError(f"--fix schedule={sched} places exactly two stages per rank in a V: pin vpp=2 "
                        "or leave vpp out")
    if sched in MULTI_STAGE_SCHEDULES and fix.get("pp") == 1:
        raise PlanError(f"--fix schedule={sched} needs a pipeline (pp >= 2), but pp=1 is pinned")
    rt = load_runtime(fix.get("runtime"))
    if sched not in rt.schedules and fix.get("pp", 2) > 1:
        can = [n for n in ("autopar", "megatron", "deepspeed", "fsdp") if sched in load_runtime(n).schedules]
        raise PlanError(f"--fix schedule={sched}: runtime '{rt.name}' has no such schedule (its "
                        f"schedules: {', '.join(rt.schedules)}); pick another schedule"
                        + (f" or --runtime {' / '.join(can)}" if can else ""))
