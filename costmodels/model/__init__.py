"""The model: time and memory of a plan on a profile — the arithmetic the search optimises.

Owns compute (matmul curves, attention, element-wise work), communication (collectives on the
tier their group crosses), memory (weights, optimizer state, activations per pipeline rank),
pipeline schedules (their orders, programs and simulator), ZeRO's HBM traffic, the search's
linear coefficients and ``estimate`` itself, which adds them into a step time. May import
``costmodels.contracts`` and ``costmodels.profiles``.
"""
