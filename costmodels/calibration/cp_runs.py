"""The runtime of each context-parallel open run (``cp_runs.csv``, the cp rows of
``dgxc_nemo_h100.csv``): which stack ran it and which of its overlaps were on.

The Llama 3.1 rows of ``dgxc_nemo_h100.csv`` carry no yaml notes; the same runs (release,
README table, GPU count) in ``cp_runs.csv`` do (``ub_tp_comm_overlap true`` for 70B, ``false``
for 8B, not stated for 405B): ``nemo_recipes.recipe_notes`` joins the copies, so a run is priced
with the switches its yaml set whichever CSV it is read from, and ``nemo_recipes.nemo_runtime``
turns the notes into the ``megatron`` runtime (its docstring says what is read and what
inferred). torchtitan and NeMo AutoModel rows run ``fsdp``.
"""
from __future__ import annotations

from costmodels.calibration.nemo_recipes import nemo_runtime


def cp_runtime(framework: str, notes: str, tp: int) -> str:
    """The runtime spec of a cp run (module docstring)."""
    if "torchtitan" in framework or "AutoModel" in framework:
        return "fsdp"
    return nemo_runtime(notes, tp)[0]
