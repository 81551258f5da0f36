"""The contracts: what every other layer reads and writes, and nothing that prices anything.

Owns the ``Plan`` (one frozen, versioned JSON record of how to parallelise), the plans file, the
``LayerTable`` the tracer hands the cost model, the step-time breakdown's vocabulary, the split and
runnability rules a plan must meet, the errors every layer raises and the input checks and atomic
file writes they share. Imports nothing else of ``costmodels`` (the ground floor) and never torch.
"""
