"""autopar.rewrite: tensor / sequence parallel and recompute as torch.fx passes over one row.

``rewrite_row(module, kind=..., tp_rank=..., tp_size=..., tp_group=..., sequence_parallel=...,
recompute=...)`` returns this rank's shard of a layer-table row as a GraphModule; see
docs/CONTRACTS-runtime.md ("Rewrite API") for the exact conventions. ``autopar apply --emit`` writes the
code of every rank's rows (``autopar.runtime.emit.dry_run``).
"""
from autopar.rewrite.collectives import FakeGroup
from autopar.rewrite.shard_layers import ShardSpec
from autopar.rewrite.state import collectives_of, gather_row_state_dict
from autopar.rewrite.tp import rewrite_row

__all__ = ["rewrite_row", "FakeGroup", "ShardSpec", "gather_row_state_dict", "collectives_of"]
