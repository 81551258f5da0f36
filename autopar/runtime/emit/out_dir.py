"""Where ``autopar apply --emit DIR`` may write, checked before any work: DIR's parent exists (no
folders are made up from a typo: ``--emit /nonexistent/x``), and DIR is new, empty, or holds only
an earlier emit's files (``stage*_tp*.py``, ``SUMMARY.md``) — never a folder of other files
(``--emit /`` or ``--emit ~``), where the emit would mix its files with the user's."""
from __future__ import annotations

import os
import re

from costmodels.contracts.checks import quote
from costmodels.contracts.errors import AutoparError

_EMITTED = re.compile(r"^(stage\d+_tp\d+\.py|SUMMARY\.md)$")


def check_emit_dir(path) -> None:
    raw = os.fspath(path)
    if not isinstance(raw, str) or not raw.strip():
        raise AutoparError("--emit names no folder; give a new folder such as emit/")
    full = os.path.abspath(raw)
    parent = os.path.dirname(full)
    if os.path.exists(full) and not os.path.isdir(full):
        raise AutoparError(f"--emit {quote(raw)} is a file; give a new folder")
    if not os.path.isdir(parent):
        raise AutoparError(f"--emit {quote(raw)}: folder {quote(parent)} does not exist; create it "
                           "first or give a folder inside an existing one")
    if os.path.isdir(full):
        others = sorted(n for n in os.listdir(full) if not _EMITTED.match(n))
        if others:
            raise AutoparError(f"--emit {quote(raw)} holds other files ({quote(others[0])}, "
                               f"{len(others)} in all); give a new or empty folder")
    elif not os.access(parent, os.W_OK):
        raise AutoparError(f"--emit {quote(raw)}: folder {quote(parent)} is not writable; choose "
                           "another folder")
