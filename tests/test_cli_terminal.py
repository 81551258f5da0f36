"""Output that fits a terminal: the search table leaves out its least needed columns (and says
which) to fit the width, ``--wide`` prints them all, explanations fold to the width; one unit
family (GiB) for memory in every command."""
from __future__ import annotations

import re

from rich.cells import cell_len

MODEL = "gpt:layers=4,hidden=64,heads=8,vocab=256,seq=64,dropout=0"
ARGS = ["search", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch", "32",
        "--top", "3", "--time-limit", "20"]


def test_search_fits_100_columns_and_wide_shows_all(monkeypatch, capsys):
    from autopar.cli.main import main
    monkeypatch.setenv("COLUMNS", "100")
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert max(cell_len(line) for line in out.splitlines()) <= 100, out
    assert "left out to fit 100 columns: TFLOP/s/GPU" in out and "--wide" in out
    assert "optimal over the searched space" in out        # the long explanation, folded
    assert main([*ARGS, "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "TFLOP/s/GPU" in wide and "left out" not in wide


def test_memory_in_gib_everywhere(capsys):
    from autopar.cli.main import main
    assert main(["estimate", MODEL, "--hardware", "a100-80g-sxm", "--gpus", "8", "--global-batch", "32",
                 "--plan", '{"dp": 8, "micro_batch_size": 4}']) == 0
    out = capsys.readouterr().out
    assert " GiB" in out and " GB" not in out
    assert main(["hardware", "a100-80g-sxm"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"gpu\.hbm_bytes\s+│\s+[\d.]+ GiB", out) and re.search(r"reserve_bytes\s+│\s+[\d.]+ GiB", out)
