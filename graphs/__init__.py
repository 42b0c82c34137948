"""The cost-annotated compute graph: data type, JSON, synthetic generators.

Imports nothing of the project and nothing of torch (the tracer that builds
graphs from ``nn.Module`` lives in ``scheduler.trace``).
"""

from .graph import (BUILD_META, COSTS_META, FORMAT_VERSION, FROZEN_META, LOOPS, SCALARS_META, TARGET_META, WORKSPACES_META,
                    CkptError, Graph, GraphError, Span)
from .node import Node
from .files import OutputPathError, check_output_path, write_text_atomic
from .io import dumps, load, loads, save
from . import synthetic

__all__ = ["BUILD_META", "FORMAT_VERSION", "FROZEN_META", "LOOPS", "COSTS_META", "SCALARS_META", "TARGET_META", "WORKSPACES_META",
           "CkptError", "Graph", "GraphError", "Node", "Span", "load", "save", "loads", "dumps", "synthetic",
           "OutputPathError", "check_output_path", "write_text_atomic"]
