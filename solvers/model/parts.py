"""A plan's parts, normalised and checked against each other and the graph: its regions, kept nodes, inner
regions, the ops its kept nodes are saved by, and the graph its chunked calls expand to (``Plan`` builds on these)."""

from __future__ import annotations

import bisect
from typing import Iterable, Sequence

from graphs import Graph

from ..errors import PlanError
from .chunks import ChunkError, expand

__all__ = ["expand_chunks", "normalise_inner", "normalise_saved", "save_ops_of", "save_op_calls_of", "normalise_regions"]


def expand_chunks(graph: Graph, chunks: Sequence[tuple[int, int, int]]) -> Graph:
    try:
        return expand(graph, chunks)
    except ChunkError as exc:
        raise PlanError(f"the plan's chunked calls do not fit this graph: {exc}") from None


def normalise_inner(inner: Iterable[Sequence[int]], regions: Sequence[tuple[int, int]],
                     saved: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``Plan.inner`` sorted and checked (NOTE [ Nested regions ] in ``solvers.model.nested``)."""
    out = normalise_regions(inner)
    if not out:
        return out
    starts = [a for a, _ in regions]
    keeps = set(saved)
    for a, b in out:
        r = bisect.bisect_right(starts, a) - 1
        if r < 0 or b > regions[r][1]:
            raise PlanError(f"inner region ({a}, {b}) lies inside no region of the plan; an inner region is checkpointed "
                            "within the recompute of the region around it (NOTE [ Nested regions ])")
        if (a, b) == regions[r]:
            raise PlanError(f"inner region ({a}, {b}) is its region itself; an inner region lies strictly inside one")
        ra, rb = regions[r]
        if any(ra <= k <= rb for k in keeps):
            raise PlanError(f"region ({ra}, {rb}) both keeps nodes (selective recompute) and holds inner regions; "
                            "a region does one or the other (NOTE [ Nested regions ])")
    return out


def normalise_saved(saved: Iterable[int], regions: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    out = sorted(set(saved))
    for i in out:
        if isinstance(i, bool) or not isinstance(i, int):
            raise PlanError(f"saved node positions must be integers, got {i!r}")
        if not any(a <= i <= b for a, b in regions):
            raise PlanError(f"the plan keeps the output of node {i}, which lies in no region "
                            "(only a region's recompute can skip a node)")
    return tuple(out)


def save_ops_of(graph: Graph, regions: Sequence[tuple[int, int]],
              saved: Sequence[int]) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Per region, the ``(overload, occurrence)`` of each kept node's creating op (see ``Plan.save_ops``)."""
    keep = set(saved)
    out = []
    for a, b in regions:
        seen: dict[str, int] = {}
        ops = []
        for i in range(a, b + 1):
            nd = graph.nodes[i]
            for pos, op in enumerate(nd.dispatch):
                if i in keep and pos == nd.sac_op:
                    ops.append((op, seen.get(op, 0)))
                seen[op] = seen.get(op, 0) + 1
        out.append(tuple(ops))
    return tuple(out)


def save_op_calls_of(graph: Graph, regions: Sequence[tuple[int, int]],
                   save_ops: Sequence[Sequence[tuple[str, int]]]) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Per region, the traced calls of each overload it keeps a call of (see ``Plan.save_op_calls``)."""
    out = []
    for (a, b), ops in zip(regions, save_ops):
        wanted = dict.fromkeys(op for op, _ in ops)
        calls = {op: 0 for op in wanted}
        for i in range(a, b + 1):
            for op in graph.nodes[i].dispatch:
                if op in calls:
                    calls[op] += 1
        out.append(tuple(calls.items()))
    return tuple(out)


def normalise_regions(regions: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    out = []
    for r in regions:
        if len(r) != 2:
            raise PlanError(f"a region is a (first, last) pair of node indices, got {r!r}")
        a, b = r
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int) or not isinstance(b, int):
            raise PlanError(f"region {tuple(r)!r}: indices must be integers")
        if a < 0 or b < a:
            raise PlanError(f"region ({a}, {b}) is invalid: need 0 <= first <= last")
        out.append((a, b))
    out.sort()
    for (a1, b1), (a2, b2) in zip(out, out[1:]):
        if a2 <= b1:
            raise PlanError(f"regions ({a1}, {b1}) and ({a2}, {b2}) overlap; regions must be disjoint")
    return tuple(out)
