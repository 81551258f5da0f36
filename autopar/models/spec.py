"""Parse a MODEL argument into a ModelSource.

Accepted forms (the same everywhere a command takes MODEL):

* a preset: ``gpt3-175b``, optionally with overrides ``gpt3-175b:seq=4096``;
* a family with settings: ``gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256``
  (families: gpt, llama, bert, vit, mlp, moe);
* a user's own code: ``path/to/file.py:fn`` or ``package.module:fn`` (see ``user_code``);
* ``hf:path/to/config.json``: a transformers model built from its config (no weights).
"""
from __future__ import annotations

import math
import re

from autopar.models.config import FAMILIES, FAMILY_KEYS, REQUIRED_KEYS, SETTING_TYPES, ModelConfig
from autopar.models.presets import PRESETS
from autopar.models.source import ModelSource, builtin_source
from costmodels.contracts.checks import limit, nearest, quote
from costmodels.contracts.errors import SpecError

# float settings: (low, high, low included); a NaN or inf is never a setting
FLOAT_RANGES = {"dropout": (0.0, 1.0, True), "norm_eps": (0.0, 1.0, False), "rope_theta": (0.0, 1e12, False),
                "capacity_factor": (0.0, 64.0, True)}


def load_model(spec: str, seq: int | None = None) -> ModelSource:
    """Resolve MODEL into a ModelSource; ``seq`` overrides the sequence length."""
    if not isinstance(spec, str):
        raise SpecError(f"MODEL must be a string, got {type(spec).__name__}")
    spec = spec.strip()
    if not spec:
        raise SpecError("empty MODEL; give a preset (see 'autopar models'), a family such as "
                        "'gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256', 'file.py:fn' or 'hf:config.json'")
    if spec.startswith("hf:"):
        from autopar.models.hf import hf_source
        return hf_source(spec, spec[3:], seq)
    name, _, settings = spec.partition(":")
    if name in PRESETS or name in FAMILIES:
        return builtin_source(spec, parse_config(name, settings, seq))
    if settings and "=" not in settings and ("/" in name or name.endswith(".py")
                                             or re.fullmatch(r"[A-Za-z_][\w.]*", name)):
        from autopar.models.user_code import user_source
        return user_source(spec, name, settings, seq)
    hint = nearest(name, list(PRESETS) + list(FAMILIES), n=3, cutoff=0.5)
    raise SpecError(f"unknown model {quote(name)}; {hint}run 'autopar models' for the presets, or use "
                    "a family ('gpt:layers=...'), 'file.py:fn' or 'hf:config.json'")


def parse_config(name: str, settings: str, seq: int | None = None) -> ModelConfig:
    """Preset or family name plus ``k=v,...`` settings → ModelConfig (validated). A setting
    given twice, unknown to the family, zero where zero would silently mean "the default", or
    above ``costmodels.contracts.checks.LIMITS`` is refused, never guessed at."""
    base = PRESETS.get(name)
    family = base.family if base else name
    allowed = FAMILY_KEYS[family]
    values: dict = {}
    for item in filter(None, (s.strip() for s in settings.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq:
            raise SpecError(f"setting {quote(item)} in '{name}' needs the form key=value, e.g. layers=12")
        if key not in allowed:
            raise SpecError(f"unknown setting {quote(key)} for family {family}; {nearest(key, allowed)}"
                            f"allowed: {', '.join(allowed)}")
        if key in values:
            raise SpecError(f"setting '{key}' is given twice in '{name}:...'; give each setting once")
        values[key] = _convert(key, raw.strip(), family)
    if seq is not None:
        values["seq"] = _convert("seq", str(seq), family)
    if base is None:
        missing = [k for k in REQUIRED_KEYS[family] if k not in values]
        if missing:
            raise SpecError(f"family {family} needs {', '.join(missing)}; e.g. "
                            f"'{family}:" + ",".join(f"{k}=..." for k in REQUIRED_KEYS[family]) + "'")
        cfg = ModelConfig(family=family, **values)
    else:
        cfg = ModelConfig(**{**base.__dict__, **values})
    _check(cfg)
    return cfg


def _convert(key: str, raw: str, family: str):
    """One ``key=raw`` setting as its type, in its range: integers from 1 to their limit (zero is
    refused: ``ffn=0`` or ``kv_heads=0`` would silently mean "the default"), floats finite."""
    typ = SETTING_TYPES[key]
    shown = quote(f"{key}={raw}")
    if key == "capacity_factor" and raw.lower() == "dropless":
        return 0.0
    try:
        if typ == "bool":
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return raw.lower() in ("true", "1", "yes")
        value = float(raw) if typ == "float" else int(raw)
    except ValueError:
        kind = {"bool": "true or false", "float": "a number"}.get(typ, "an integer")
        raise SpecError(f"setting {shown} for family {family} must be {kind}") from None
    if typ == "float":
        low, high, low_ok = FLOAT_RANGES[key]
        if not (math.isfinite(value) and (value >= low if low_ok else value > low) and value < high):
            raise SpecError(f"setting {shown} for family {family} must be a number "
                            f"{'at least' if low_ok else 'above'} {low:g} and below {high:g}")
        return value
    if value < (0 if key in ("shared_experts", "dense_layers") else 1):
        raise SpecError(f"setting {shown} for family {family} must be at least 1 (leave '{key}' out "
                        "for the family's default)")
    limit(key, value, SpecError, what=f"setting '{key}'")
    return value


def _check(cfg: ModelConfig) -> None:
    for key in ("layers", "hidden", "heads", "seq"):
        if getattr(cfg, key) < 1:
            raise SpecError(f"setting '{key}' must be at least 1 (got {getattr(cfg, key)})")
    if cfg.family != "mlp" and cfg.hidden % cfg.heads:
        raise SpecError(f"hidden={cfg.hidden} is not divisible by heads={cfg.heads}; "
                        "choose heads that divide hidden")
    if cfg.heads % cfg.n_kv_heads:
        raise SpecError(f"heads={cfg.heads} is not divisible by kv_heads={cfg.n_kv_heads}")
    if cfg.family == "moe":
        from autopar.models.moe import check_moe_config
        check_moe_config(cfg)
        from autopar.models.mla import check_mla_config
        check_mla_config(cfg)   # Multi-head Latent Attention's widths
    if cfg.family in ("gpt", "llama", "bert", "moe") and cfg.vocab < 1:
        raise SpecError(f"family {cfg.family} needs vocab >= 1")
    if cfg.family == "vit":
        if cfg.image % cfg.patch:
            raise SpecError(f"image={cfg.image} is not divisible by patch={cfg.patch}; choose a patch "
                            "size that divides the image side")
        limit("seq", cfg.tokens_per_sample, SpecError,
              what=f"ViT tokens per image ((image/patch)² + 1 = ({cfg.image}/{cfg.patch})² + 1)")
    if not 0.0 <= cfg.dropout < 1.0:
        raise SpecError(f"dropout={cfg.dropout} must be in [0, 1)")
