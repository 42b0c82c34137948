"""``same(j, t)``: the CP-SAT literal "nodes ``j <= t`` lie in one region", built without recursion.

NOTE [ Building same(j, t) ]
    ``ilp``'s model (NOTE [ An exact model of simulate ] in ``solvers.ilp``)
    asks, for a tensor ``j`` and a reader ``t``, whether both lie in one
    region. Two constructions, both exact:

    * on a graph with spans (NOTE [ Module-aligned regions ] in
      ``graphs.graph``) the chosen spans are disjoint, so ``j`` and ``t`` share
      a region exactly when one chosen span holds both: ``same(j, t)`` is the
      sum of the span bools ``z`` over the usable spans around ``[j, t]``
      (0 or 1). It depends only on that set of spans, so one literal serves
      every pair with the same set (a transformer has a handful: the block,
      a sub-layer, the whole model); pairs no span holds are the constant 0.
    * without spans, ``same(j, t) = cont[j + 1] and same(j + 1, t)``: a chain
      of literals per reader ``t``, shared by every ``j`` below it. It used to
      be built by recursion, once per node of the chain: a tensor read 2,000
      nodes after its producer (the rotary tables of a Llama op graph) raised
      ``RecursionError``. The chain is now built in a loop from the nearest
      literal already made; a node that cannot be recomputed between ``j``
      and ``t`` makes it the constant 0 at once.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from ortools.sat.python import cp_model

from graphs import Graph

from ..model.spans import SpanIndex

__all__ = ["SameLiterals"]


class SameLiterals:
    """Makes and caches ``same(j, t)`` for one model.

    Args:
        graph: the cost graph.
        m: the CP-SAT model.
        x: ``x[k]``, node ``k`` is in a region.
        cont: ``cont[k]``, node ``k`` continues the region of ``k - 1``.
        z: ``{(a, b): bool}`` of the usable spans (aligned graphs), else empty.
        tick: called every few hundred literals made (the model's deadline check: NOTE [ One deadline ]).
    """

    def __init__(self, graph: Graph, m: cp_model.CpModel, x: list, cont: list, z: dict,
                 tick: Callable[[], None] | None = None) -> None:
        self.m, self.x, self.cont, self.z = m, x, cont, z
        self._tick = tick  # the model's deadline check: one call may make a chain of thousands of literals
        self.aligned = bool(graph.spans)
        bad = np.concatenate(([0], np.cumsum([not nd.recomputable for nd in graph.nodes])))
        self._bad = bad.astype(np.int64).tolist()  # non-recomputable nodes before each position
        self._zero = m.NewConstant(0)
        self._chain: dict[tuple[int, int], cp_model.IntVar] = {}
        self._by_spans: dict[tuple[tuple[int, int], ...], cp_model.IntVar] = {}
        if self.aligned:
            spans = SpanIndex(graph).spans
            self._spans = spans
            # around[k]: the usable spans holding k (in the order of ``spans``).
            around: list[list[int]] = [[] for _ in range(len(graph))]
            for s, (a, b) in enumerate(spans):
                for k in range(a, b + 1):
                    around[k].append(s)
            self._around = around
        self.made = 0  # literals created (for logs and tests)

    def __call__(self, j: int, t: int):
        """Literal: ``j <= t`` lie in one region."""
        if j == t:
            return self.x[j]
        if self._bad[t + 1] != self._bad[j]:
            return self._zero  # a node in [j, t] is never in a region
        if self.aligned:
            return self._spanned(j, t)
        if t == j + 1:
            return self.cont[t]
        return self._chained(j, t)

    def _spanned(self, j: int, t: int):
        key = tuple(s for s in self._around[j] if self._spans[s][1] >= t)
        if not key:
            return self._zero
        lit = self._by_spans.get(key)
        if lit is None:
            lit = self.m.NewBoolVar(f"same_s{key[0]}_{len(key)}")
            self.m.Add(lit == sum(self.z[self._spans[s]] for s in key))
            self._by_spans[key] = lit
            self.made += 1
        return lit

    def _chained(self, j: int, t: int):
        cached = self._chain.get((j, t))
        if cached is not None:
            return cached
        # Walk up from j to the nearest literal already made for reader t (or cont[t] at t - 1) ...
        top = j + 1
        while top < t - 1 and (top, t) not in self._chain:
            top += 1
        lit = self.cont[t] if top == t - 1 and (top, t) not in self._chain else self._chain[top, t]
        # ... then make same(i, t) = cont[i + 1] and same(i + 1, t) for i = top - 1 down to j.
        m = self.m
        for i in range(top - 1, j - 1, -1):
            a, b = self.cont[i + 1], lit
            lit = m.NewBoolVar(f"same{i}_{t}")
            m.AddImplication(lit, a)
            m.AddImplication(lit, b)
            m.AddBoolOr([a.Not(), b.Not(), lit])
            self._chain[i, t] = lit
            self.made += 1
            if self._tick is not None and not self.made % 256:
                self._tick()
        return lit
