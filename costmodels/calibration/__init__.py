"""The calibration: the cost model against published runs, and the fit of its few constants.

Owns the open runs (``../shared/validation``-style CSVs read into plans), their scoring
(``validation``) and the fit of each GPU's and stack's constants on a documented calibration
split (``fit``). Its output (profile constants, ``profiles/error_bands.toml``) is written by
``benchmarks/bench_costmodels_validation.py``. May import every other ``costmodels`` sub-package;
nothing in ``costmodels`` imports it.
"""
