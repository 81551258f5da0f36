"""Error bars: how far off a prediction is likely to be, from the check residuals of its regime.

A prediction's *regime* is (GPU, kernel stack, parallelism family): the hardware profile's name,
the kernel stack its runtime runs (``RuntimeProfile.kernel_stack``, ``kernel_stacks.py``: the
software decides the error's sign, not the GPU) and ``family(plan)`` — ``"dp"`` (data
parallelism / ZeRO only), ``"tp+pp"`` (model parallelism without data parallelism) or ``"3d"``.
For every regime that has check rows (``benchmarks/bench_costmodels_validation.py`` scores them
and writes ``costmodels/profiles/error_bands.toml``), the band is the 90th percentile of the check
rows' absolute relative step-time errors (their largest when the regime has fewer than 10 rows).
Calibration rows never enter a band.

A prediction in a regime without check rows takes the WIDEST band of its GPU (any stack, any
family), never a narrow neighbour's; a GPU without any check row takes the widest band of all
(``borrow``). The band says so (``exact`` false, ``regime`` names where it comes from).
``band_for`` returns ``{"relative", "regime", "rows", "exact"}``; ``format_band`` renders
``16.1 s ± 9 %`` (``± ~9 %`` for a borrowed band).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib

BANDS_FILE = Path(__file__).resolve().parent / "error_bands.toml"


def family(plan) -> str:
    """The parallelism family of a plan (module docstring)."""
    model = plan.tp > 1 or plan.pp > 1
    if not model:
        return "dp"
    return "3d" if plan.dp > 1 else "tp+pp"


def percentile_band(errors: list[float]) -> float:
    """The band of a regime's check errors: the 90th percentile of |error| (nearest rank), the
    largest when there are fewer than 10."""
    a = sorted(abs(e) for e in errors)
    if not a:
        raise ValueError("no check errors")
    if len(a) < 10:
        return a[-1]
    k = max(0, min(len(a) - 1, int(-(-0.9 * len(a) // 1)) - 1))
    return a[k]


@lru_cache(maxsize=4)
def load_bands(path: str = str(BANDS_FILE)) -> tuple[dict, ...]:
    """The bands file's entries (empty when it is missing: no band is known)."""
    p = Path(path)
    if not p.is_file():
        return ()
    with open(p, "rb") as f:
        data = tomllib.load(f)
    out = []
    for i, b in enumerate(data.get("band", [])):
        for key, typ in (("hardware", str), ("stack", str), ("family", str), ("relative", float),
                         ("rows", int)):
            if not isinstance(b.get(key), (typ, int) if typ is float else typ) or isinstance(b.get(key), bool):
                raise ProfileError(f"error bands '{p}': band {i + 1} field '{key}' is missing or not a "
                                   f"{typ.__name__}; regenerate it with benchmarks/bench_costmodels_validation.py")
        out.append(dict(b))
    return tuple(out)


def stack_of(runtime: str) -> str:
    """The kernel stack of a runtime by name (its base name when the profile names none)."""
    from costmodels.profiles.runtime import load_runtime
    prof = load_runtime(runtime)
    return prof.kernel_stack or prof.base


def band_for(hardware: str, runtime: str, plan, borrow: bool = True) -> dict | None:
    """The band of ``plan``'s regime on ``hardware`` under ``runtime`` (a runtime name; its kernel
    stack decides), or the widest band of the GPU, or of all (module docstring); None without a
    bands file, or when nothing on this hardware was checked and ``borrow`` is false (a CPU host:
    GPU runs say nothing about it)."""
    bands = load_bands()
    if not bands or (not borrow and not any(b["hardware"] == hardware for b in bands)):
        return None
    fam = family(plan)
    stack = stack_of(runtime)
    exact = [b for b in bands if (b["hardware"], b["stack"], b["family"]) == (hardware, stack, fam)]
    if exact:
        b = exact[0]
        return {"relative": float(b["relative"]), "regime": f"{hardware} · {stack} · {fam}",
                "rows": int(b["rows"]), "exact": True}
    pool = [b for b in bands if b["hardware"] == hardware] or list(bands)
    widest = max(pool, key=lambda b: b["relative"])
    where = "the widest on this GPU" if widest["hardware"] == hardware else "the widest of any GPU"
    return {"relative": float(widest["relative"]), "rows": int(widest["rows"]), "exact": False,
            "regime": f"no check rows for {hardware} · {stack} · {fam}; {where}: "
                      f"{widest['hardware']} · {widest['stack']} · {widest['family']}"}


def format_band(seconds: float, band: dict | None, *, short: bool = False) -> str:
    """``16.1 s ± 9 %`` (``± ~9 %``: a band borrowed from another regime); the seconds alone
    without a band. ``short``: ``16.1 ± 9%`` for a table whose column names the unit."""
    unit, sep = ("", "") if short else (" s", " ")
    if not band:
        return f"{seconds:.4g}{unit}"
    return f"{seconds:.4g}{unit} ± {'' if band.get('exact') else '~'}{100 * band['relative']:.0f}{sep}%"


def band_suffix(band: dict | None) -> str:
    """`` ± 9 %`` (`` ± ~9 %`` borrowed) to follow a step time already formatted; empty without a
    band."""
    if not band:
        return ""
    return f" ± {'' if band.get('exact') else '~'}{100 * band['relative']:.0f} %"
