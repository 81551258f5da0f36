"""Writing hardware profiles: ``dump_profile``, the inverse of ``costmodels.profiles.hardware_files.parse_profile``.

The format (fields, units, what each figure means) is documented once, in the
``costmodels/profiles/hardware.py`` docstring; ``parse_profile`` reads it and this module writes it, so
that whoever produces a profile (``autopar profile``) builds a plain dict, the same dict
``tomllib`` would give back for the file, and never spells TOML itself.

``dump_profile(document, header=..., table_comments=...) -> str`` is a small TOML emitter for
the value types profiles use (no third-party writer: ``costmodels`` stays dependency-light):

* strings, integers, floats (``repr``: the shortest text that reads back as the same float;
  ``inf`` / ``nan`` as TOML spells them), booleans, and lists of those;
* a dict holding a ``"value"`` key is a *figure* and is written inline,
  ``{ value = ..., source = "..." }``, so that each number sits on one line with its citation;
* every other dict is a table: ``[gpu]``, ``[gpu.matmul_efficiency]``, ``[collectives.p2p]``,
  written after the plain keys of its parent (TOML would read later keys into the sub-table).

Key order is the dict's. ``header`` becomes ``#`` comment lines at the top and
``table_comments`` maps a table's dotted name to a comment after its ``[header]``: comments the
reader ignores, for the person who opens the file. The text is checked with ``parse_profile``
before it is returned, so ``parse_profile(tomllib.loads(dump_profile(d)))`` is the profile
``parse_profile(d)`` is, and a document that is not a valid profile raises ``ProfileError``
naming the field, as reading it would.
"""
from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib
from costmodels.profiles.hardware_files import parse_profile

__all__ = ["dump_profile"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def dump_profile(document: Mapping[str, Any], *, header: str = "",
                 table_comments: Mapping[str, str] | None = None, where: str = "<profile>") -> str:
    """TOML text of a profile ``document`` (the dict ``parse_profile`` reads), validated;
    ``where`` names it in errors."""
    if not isinstance(document, Mapping):
        raise ProfileError(f"hardware profile '{where}': the document must be a dict of fields, "
                           f"got {type(document).__name__}")
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    _table(document, (), lines, dict(table_comments or {}), where)
    text = "\n".join(lines) + "\n"
    parse_profile(tomllib.loads(text), where)
    return text


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping) and "value" not in value


def _table(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str],
           comments: dict[str, str], where: str) -> None:
    """``table``'s plain keys, then each sub-table under its own ``[header]`` (a table holding
    only sub-tables, such as ``collectives``, needs none)."""
    for key, value in table.items():
        if not _is_table(value):
            field = _field(path + (_checked(key, _field(path), where),))
            lines.append(f"{_key(key)} = {_value(value, field, where)}")
    for key, value in table.items():
        if not _is_table(value):
            continue
        sub = path + (_checked(key, _field(path), where),)
        if not value or any(not _is_table(v) for v in value.values()):
            comment = comments.get(_field(sub))
            lines += ["", f"[{'.'.join(_key(k) for k in sub)}]" + (f"   # {comment}" if comment else "")]
        _table(value, sub, lines, comments, where)


def _checked(key: Any, parent: str, where: str) -> str:
    if not isinstance(key, str):
        raise ProfileError(f"hardware profile '{where}': key {key!r} under "
                           f"'{parent or '(top level)'}' must be a string")
    return key


def _field(path: tuple[str, ...]) -> str:
    """A field's dotted name as errors and ``table_comments`` spell it (``gpu.hbm_bytes``)."""
    return ".".join(path)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(value: Any, field: str, where: str) -> str:
    """One TOML value; anything a profile cannot hold is a ProfileError naming the field."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):     # numpy's integers too
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)                    # repr of a numpy float is not TOML
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, f"{field}[{i}]", where) for i, v in enumerate(value)) + "]"
    if isinstance(value, Mapping):   # a figure: { value = ..., source = "..." }
        return "{ " + ", ".join(f"{_key(_checked(k, field, where))} = {_value(v, f'{field}.{k}', where)}"
                                for k, v in value.items()) + " }"
    shown = " ".join(repr(value).split())[:60]     # one line, whatever the object's repr
    raise ProfileError(f"hardware profile '{where}': field '{field}' is a {type(value).__name__} "
                       f"({shown}); a profile holds strings, numbers, booleans and lists of them")
