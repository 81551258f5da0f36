"""Where the shipped profiles are: the repository's top-level folders, or the installed copy.

The hardware and runtime profiles live at the repository root (``hardware-profiles/``,
``runtime-profiles/``) so a user can find, read and edit them without opening the package. A
wheel installs the same files as package data (``pyproject.toml`` maps those folders to
``costmodels/hardware_profiles`` and ``costmodels/runtime_profiles``), so the loaders look in
the checkout first and in the installed package second.
"""
from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]      # costmodels/
_CHECKOUT = _PACKAGE.parent                          # the repository root in a checkout


def shipped_dir(folder: str) -> Path:
    """The folder of shipped ``*.toml`` profiles named ``folder`` ('hardware-profiles' or
    'runtime-profiles'): the checkout's top-level one when it exists, else the installed copy."""
    here = _CHECKOUT / folder
    if here.is_dir():
        return here
    return _PACKAGE / folder.replace("-", "_")
