"""``autopar train MODEL --plan P --global-batch B --data PATH|random --steps N ...``: see
``autopar.train`` (the command's flags and work live there, so ``python -m autopar.train`` is
the same command)."""
from __future__ import annotations

from autopar.train.cli import register, run

__all__ = ["register", "run"]
