"""How many token rows a chunk of a call computes (NOTE [ Chunk counts and rows ] in ``solvers.model.chunks``).

The arithmetic the chunk expansion (``solvers.model.chunks``), the fused head
(``solvers.model.fused``) and the runtime (``scheduler.applying.chunked``)
share: how a call's rows split into chunks, the bound the traced inputs put
on them, and what a call's nodes are read through (views, products).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from graphs import Graph

__all__ = ["chunk_rows", "token_rows", "call_rows"]

#: Matrix products: row-wise when they read one tensor of the call (the other operand a parameter).
_MATMUL_OPS = frozenset({"aten.linear.default", "aten.addmm.default", "aten.mm.default", "aten.matmul.default"})


def token_rows(meta: Mapping[str, Any], *, integers: bool = False) -> int | None:
    """A bound on the rows a call of a traced step computes, from the inputs its graph's meta records (NOTE
    [ Chunk counts and rows ]): the most elements of an input (of an integer input with ``integers``: the labels
    a cross-entropy reads, batch x sequence); None when no such input is recorded."""
    rows = None
    for spec in meta.get("inputs") or ():
        if not isinstance(spec, Mapping) or integers and not str(spec.get("dtype", "")).startswith(("int", "uint")):
            continue
        shape = spec.get("shape")
        if isinstance(shape, (list, tuple)) and all(isinstance(d, int) and d >= 0 for d in shape):
            rows = max(rows or 0, math.prod(shape))
    return rows


def chunk_rows(rows: int, k: int) -> list[int]:
    """The rows of each chunk the runtime makes of ``rows`` rows in ``k`` chunks (``scheduler.applying.chunked``):
    chunks of ``ceil(rows / k)`` rows, the last one shorter, and fewer than ``k`` chunks when fewer fill the rows
    (10 rows in 4: 3, 3, 3, 1; 6 rows in 4: 2, 2, 2)."""
    size = max(-(-rows // k), 1)
    count = max(1, min(k, -(-rows // size)))
    return [size] * (count - 1) + [rows - size * (count - 1)]


def _base(graph: Graph, j: int) -> int:
    """The tensor ``j`` is a view of (through zero-byte nodes), or ``j``."""
    while graph.nodes[j].out_bytes == 0 and graph.preds[j]:
        j = graph.preds[j][0]
    return j


def _products(nd: Any) -> int:
    """How many matrix products node ``nd`` runs: one for a product's own node, or those its dispatch lists (a node
    grouping an MLP's ops at a coarse granularity runs all of its products; NOTE [ Chunked head ])."""
    return max(int(nd.op in _MATMUL_OPS), sum(op in _MATMUL_OPS for op in nd.dispatch))


def call_rows(graph: Graph, first: int, last: int) -> int | None:
    """The token rows the call ``first..last`` of ``graph`` splits into chunks (NOTE [ Chunk counts and rows ]):
    those its first node computes (``Node.rows``, recorded by the trace), or, on a graph that does not record
    them, the tail's labels (the most elements of an integer input); None when neither is known."""
    rows = graph.nodes[first].rows
    if rows:
        return rows
    return token_rows(graph.meta, integers=True) if last == len(graph) - 1 else None
