"""The suite's ranks start from a fork server that has imported torch and autopar once
(``autopar.runtime.verify.rank_start``): every world of ``serial.spawn`` — the shared gloo worlds,
``autopar verify``/``profile``/``validate`` run in-process or as a subprocess of a test — forks its
ranks instead of importing torch once per rank. Users' runs keep ``spawn`` (the default);
``tests/test_runtime_rank_start.py`` runs the same world both ways and compares.

``AUTOPAR_RANK_START`` already set (``=spawn``) wins: the whole suite with fresh interpreters.
"""
from __future__ import annotations

import os

os.environ.setdefault("AUTOPAR_RANK_START", "forkserver")
