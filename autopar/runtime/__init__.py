"""autopar.runtime: run a Plan on torch.distributed (see ``autopar.runtime.apply``)."""
from autopar.runtime.apply import Runner, apply

__all__ = ["Runner", "apply"]
