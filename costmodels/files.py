"""Writing output files so that nothing is ever half-written.

Every file autopar writes (plans files, profiles, reports, validate results) goes through
``write_text_atomic``: a temporary file in the target folder, fsync, then ``os.replace``. A reader
never sees half a file, and a failed or interrupted write leaves the old file as it was.
"""
from __future__ import annotations

import os
import tempfile

from costmodels.errors import AutoparError

try:
    import tomllib  # noqa: F401  (re-exported: the TOML reader every profile reader uses)
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI (a dependency there)
    import tomli as tomllib  # noqa: F401


def write_text_atomic(path: str | os.PathLike, text: str, create_folder: bool = True) -> None:
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        if not create_folder:
            raise AutoparError(f"cannot write '{path}': folder '{folder}' does not exist; create it first")
        os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
