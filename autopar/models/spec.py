"""Parse a MODEL argument into a ModelSource.

Accepted forms (the same everywhere a command takes MODEL):

* a preset: ``gpt3-175b``, optionally with overrides ``gpt3-175b:seq=4096``;
* a family with settings: ``gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256``
  (families: gpt, llama, bert, vit, mlp);
* a user's own code: ``path/to/file.py:fn`` or ``package.module:fn`` (see ``user_code``);
* ``hf:path/to/config.json``: a transformers model built from its config (no weights).
"""
from __future__ import annotations

import difflib
import re

from autopar.models.config import FAMILIES, FAMILY_KEYS, REQUIRED_KEYS, SETTING_TYPES, ModelConfig
from autopar.models.presets import PRESETS
from autopar.models.source import ModelSource, builtin_source
from costmodels.errors import SpecError


def load_model(spec: str, seq: int | None = None) -> ModelSource:
    """Resolve MODEL into a ModelSource; ``seq`` overrides the sequence length."""
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
    close = difflib.get_close_matches(name, list(PRESETS) + list(FAMILIES), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise SpecError(f"unknown model '{name}'; {hint}run 'autopar models' for the presets, or use "
                    "a family ('gpt:layers=...'), 'file.py:fn' or 'hf:config.json'")


def parse_config(name: str, settings: str, seq: int | None = None) -> ModelConfig:
    """Preset or family name plus ``k=v,...`` settings → ModelConfig (validated)."""
    base = PRESETS.get(name)
    family = base.family if base else name
    allowed = FAMILY_KEYS[family]
    values: dict = {}
    for item in filter(None, (s.strip() for s in settings.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq:
            raise SpecError(f"setting '{item}' in '{name}' needs the form key=value, e.g. layers=12")
        if key not in allowed:
            raise SpecError(f"unknown setting '{key}' for family {family}; allowed: {', '.join(allowed)}")
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
    typ = SETTING_TYPES[key]
    try:
        if typ == "bool":
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return raw.lower() in ("true", "1", "yes")
        value = float(raw) if typ == "float" else int(raw)
    except ValueError:
        kind = {"bool": "true or false", "float": "a number"}.get(typ, "an integer")
        raise SpecError(f"setting '{key}={raw}' for family {family} must be {kind}") from None
    if typ == "int" and value < 0 or typ == "float" and value < 0:
        raise SpecError(f"setting '{key}={raw}' for family {family} must not be negative")
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
    if cfg.family in ("gpt", "llama", "bert") and cfg.vocab < 1:
        raise SpecError(f"family {cfg.family} needs vocab >= 1")
    if cfg.family == "vit" and cfg.image % cfg.patch:
        raise SpecError(f"image={cfg.image} is not divisible by patch={cfg.patch}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise SpecError(f"dropout={cfg.dropout} must be in [0, 1)")
