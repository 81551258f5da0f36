"""autopar.trace: a model → its LayerTable (see ``costmodels.contracts.layer_table``) and fx/networkx graph.

``trace_model(source, micro_batch=1, leaf_modules=())`` traces a ModelSource on meta tensors;
``table_for(spec, micro_batch=1, seq=None)`` is the cached convenience most callers want;
``trace_graph(...)`` returns everything (table, fx graphs, networkx graph via ``.graph``).
"""
from autopar.trace.driver import TraceResult, find_block_list, table_for, trace_graph, trace_model

__all__ = ["TraceResult", "find_block_list", "table_for", "trace_graph", "trace_model"]
