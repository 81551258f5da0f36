"""autopar.validate: run plans for real and set the measurements beside the predictions.

The driver is ``autopar.validate.run`` (what is predicted, what is measured and how);
``autopar.validate.rank`` is what each spawned rank does, ``live_bytes`` the CPU peak-memory
meter, ``stats`` MAPE and Spearman.
"""
from autopar.validate.run import default_plans, is_validate_output, summarize, validate

__all__ = ["validate", "default_plans", "summarize", "is_validate_output"]
