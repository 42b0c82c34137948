"""How many token rows a chunk of a call computes (NOTE [ Chunk counts and rows ] in ``solvers.model.chunks``).

The arithmetic the chunk expansion (``solvers.model.chunks``) and the runtime
(``scheduler.applying.chunked``) share: how a call's rows split into chunks,
and the bound the traced inputs put on them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["chunk_rows", "token_rows"]


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
