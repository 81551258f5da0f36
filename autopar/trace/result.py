"""``TraceResult``: what one trace produced, kept apart from the driver that produces it
(``autopar.trace.driver``) so the table builder and the graph builder can name it without
importing the driver."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx
import torch.nn as nn

from autopar.trace.blocks import RowInfo
from autopar.trace.measure import Recorder
from costmodels.contracts.layer_table import LayerTable


@dataclass
class TraceResult:
    """Everything the trace knows: the LayerTable, the fx graphs and the measurements."""

    table: LayerTable
    model: nn.Module
    top: fx.GraphModule                      # top level, blocks as call_module leaves
    blocks: dict[int, fx.GraphModule]        # row index of a measured block -> its graph
    rows: list[RowInfo]
    node_row: dict[str, int]                 # top-level node name -> row index
    rec: Recorder
    _graph: Any = field(default=None, repr=False)

    @property
    def graph(self):
        """networkx DiGraph of the whole model: one node per fx node (blocks expanded as
        ``<row>/<node>``), with attributes row, op, target, fwd_flops, bwd_flops,
        output_bytes, param_bytes, saved_bytes."""
        if self._graph is None:
            from autopar.trace.graph import build_graph
            self._graph = build_graph(self)
        return self._graph
