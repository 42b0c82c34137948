"""Module-aligned regions on the solvers' side (NOTE [ Module-aligned regions ] in ``graphs.graph``).

On a graph with spans a plan may only use regions whose ``(first, last)`` is
some span's. The exact solvers read the allowed regions per start position
(:attr:`SpanIndex.ends`); the heuristics build their usual plans and then
*snap* them onto spans (:meth:`SpanIndex.snap`): a region becomes the
longest spans inside it (its *tiling*) or the shortest span around it (its
*cover*).

Spans usually nest like the module tree but need not (runs of consecutive
``nn.Sequential`` children overlap), so nothing here assumes they nest.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from graphs import Graph

__all__ = ["SpanIndex", "Regions"]

Regions = tuple[tuple[int, int], ...]


class SpanIndex:
    """The usable spans of one graph (allowed, every node recomputable), indexed.

    On a graph without spans every method answers as if every interval were
    a span: :attr:`ends` is None and :meth:`snap` returns the regions as given.

    Attributes:
        aligned: the graph has spans.
        spans: the usable spans, sorted by ``(first, last)``.
        ends: per start position ``p``, the last nodes ``b`` (ascending) of the
            usable spans ``[p, b]``; None on a graph without spans.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.n = len(graph)
        self.aligned = bool(graph.spans)
        bad = np.concatenate(([0], np.cumsum([not nd.recomputable for nd in graph.nodes]))).astype(np.int64)
        self.spans: list[tuple[int, int]] = sorted(
            (sp.first, sp.last) for sp in graph.spans if bad[sp.last + 1] == bad[sp.first])
        self.ends: list[np.ndarray] | None = None
        if self.aligned:
            ends: list[list[int]] = [[] for _ in range(self.n)]
            for a, b in self.spans:
                ends[a].append(b)
            self.ends = [np.array(e, dtype=np.int64) for e in ends]
        self._around: list[list[tuple[int, int, int]]] | None = None
        self._covers: dict[tuple[int, int], tuple[int, int] | None] = {}

    # ------------------------------------------------------------- snapping
    def tile(self, regions: Iterable[Sequence[int]]) -> Regions:
        """Each region replaced by the usable spans inside it, left to right,
        each the longest that starts at its position (positions where none
        starts stay stored)."""
        if self.ends is None:
            return tuple((int(a), int(b)) for a, b in regions)
        out = []
        for a, b in regions:
            p = int(a)
            while p <= b:
                e = self.ends[p]
                q = int(np.searchsorted(e, b, side="right")) - 1
                if q >= 0:
                    out.append((p, int(e[q])))
                    p = int(e[q]) + 1
                else:
                    p += 1
        return tuple(out)

    def cover_of(self, a: int, b: int) -> tuple[int, int] | None:
        """The shortest usable span containing ``[a, b]`` (ties: the first), or None."""
        key = (int(a), int(b))
        if key not in self._covers:
            if self._around is None:
                # around[k]: (length, first, last) of the spans holding k, shortest first.
                around: list[list[tuple[int, int, int]]] = [[] for _ in range(self.n)]
                for x, y in self.spans:
                    for k in range(x, y + 1):
                        around[k].append((y - x, x, y))
                for lst in around:
                    lst.sort()
                self._around = around
            self._covers[key] = next(((x, y) for _, x, y in self._around[key[0]] if y >= key[1]), None)
        return self._covers[key]

    def cover(self, regions: Iterable[Sequence[int]]) -> Regions:
        """Each region replaced by the shortest usable span around it (none:
        dropped); left to right, a span overlapping one kept before it is dropped."""
        if self.ends is None:
            return tuple((int(a), int(b)) for a, b in regions)
        chosen = {c for a, b in regions if (c := self.cover_of(a, b)) is not None}
        out: list[tuple[int, int]] = []
        for x, y in sorted(chosen):
            if not out or x > out[-1][1]:
                out.append((x, y))
        return tuple(out)

    def snap(self, regions: Iterable[Sequence[int]]) -> list[Regions]:
        """The plans a heuristic's ``regions`` become: their tiling and their
        cover on an aligned graph (one plan if both agree); the regions
        themselves on a graph without spans."""
        regions = tuple((int(a), int(b)) for a, b in regions)
        if not self.aligned:
            return [regions]
        tiled, covered = self.tile(regions), self.cover(regions)
        return [tiled] if tiled == covered else [tiled, covered]

    # ------------------------------------------------------------ two plans
    def finest(self) -> Regions:
        """Left to right, the shortest usable span at each position; without
        spans, every recomputable node its own region."""
        if self.ends is None:
            return tuple((k, k) for k, nd in enumerate(self.graph.nodes) if nd.recomputable)
        out, p = [], 0
        while p < self.n:
            e = self.ends[p]
            if len(e):
                out.append((p, int(e[0])))
                p = int(e[0]) + 1
            else:
                p += 1
        return tuple(out)

    def coarsest(self) -> Regions:
        """Left to right, the longest usable span at each position; without
        spans, the whole graph as one region when every node is recomputable."""
        if self.ends is None:
            return ((0, self.n - 1),) if all(nd.recomputable for nd in self.graph.nodes) else ()
        return self.tile([(0, self.n - 1)])
