"""The cost-annotated compute graph: data type, JSON, synthetic generators.

Owns, bottom first: ``errors`` (the project's root error types), ``schema``
(the JSON form's keys, limits and strict checks) and ``files`` (atomic
writes), ``node`` (a node and its reader), ``graph`` (the graph, its spans and
its reader), ``io`` and ``synthetic`` (graphs for tests and benchmarks).

May import: nothing of the project, and nothing of torch (the tracer that
builds graphs from ``nn.Module`` lives in ``scheduler.trace``). Each module
imports only those before it (``tests/test_layers.py``).
"""

from .errors import CkptError, GraphError
from .schema import BUILD_META, CALL_RETURNS_META, COSTS_META, CUDA_BLOCK, FORMAT_VERSION, FROZEN_META, FUSED_HEADS_META, HOLDS_OP, LM_HEADS_META, LOOPS, SCALARS_META, TARGET_META, WORKSPACES_META, storage_unit
from .graph import Graph, Span
from .node import Node
from .files import OutputPathError, check_output_path, write_text_atomic
from .io import dumps, load, loads, save
from . import synthetic

__all__ = ["BUILD_META", "CALL_RETURNS_META", "CUDA_BLOCK", "storage_unit", "FORMAT_VERSION", "FROZEN_META", "FUSED_HEADS_META", "HOLDS_OP", "LM_HEADS_META", "LOOPS", "COSTS_META", "SCALARS_META", "TARGET_META", "WORKSPACES_META",
           "CkptError", "Graph", "GraphError", "Node", "Span", "load", "save", "loads", "dumps", "synthetic",
           "OutputPathError", "check_output_path", "write_text_atomic"]
