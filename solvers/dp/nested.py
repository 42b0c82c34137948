"""Nested regions in ``dp``: the segment profile of a region whose child calls are checkpointed inside it.

NOTE [ Nested regions in the chain decomposition ]
    With ``nested=True`` every region candidate ``i..j`` of ``dp`` that has
    child calls (NOTE [ The menu of inner regions ] in ``solvers.model.nested``)
    comes once more, nested, as one more candidate segment. Its forward is the
    plain region's (it keeps its inputs), so NOTE [ Decomposing the simulated
    peak over a chain ] (``solvers.dp.profiles``) holds for it unchanged: what it
    retains for the segments after it is the plain region's plus the
    generator states its stochastic inner regions store in the forward, and
    its boundary state is the plain region's. Only its own steps differ (its
    recompute, the inner recomputes, its backward), so its local peak is the
    plain region's plus the difference of the two at the region's own steps,
    and its cost the plain one's plus the difference of the two recompute
    costs. Both differences are read off ``simulate`` (the one cost model),
    on plans that hold many disjoint candidates at once, plain in one plan and
    nested in the other: by the decomposition, a region's steps see the same
    bytes of the segments around it in both (less the generator states the
    nested regions before it retain, which are subtracted). On a chain the
    table stays exact, now over ``(region, nested or not)`` pairs.
"""

from __future__ import annotations

import bisect

import numpy as np

from graphs import Graph

from ..model.plan import Plan
from ..model.simulate import simulate
from ..model.terms import region_rng_bytes
from ..model.nested import inner_menu

__all__ = ["NESTED_CODE", "NestedRuns"]

#: ``choice // m`` of a nested region in the table (kept-set menus use 1.. their size).
NESTED_CODE = 1 << 20


class NestedRuns:
    """The nested candidates of a graph, profiled once (NOTE [ Nested regions in the chain decomposition ]).

    Attributes:
        delta: ``(first, last) -> (extra local peak, extra cost, extra retained bytes)`` for every
            candidate region with child calls.
    """

    def __init__(self, graph: Graph, candidates: list[tuple[int, int]]) -> None:
        self.graph = graph
        self.delta: dict[tuple[int, int], tuple[int, int, int]] = {}
        nested = sorted(r for r in set(candidates) if inner_menu(graph, *r))
        rng = {r: sum(region_rng_bytes(graph, inner_menu(graph, *r))) for r in nested}
        for layer in _layers(nested):
            inner = tuple(x for r in layer for x in inner_menu(graph, *r))
            plain = simulate(graph, Plan(regions=tuple(layer)))
            nest = simulate(graph, Plan(regions=tuple(layer), inner=inner))
            p_peak, n_peak = _peaks(plain, layer), _peaks(nest, layer)
            p_cost, n_cost = _costs(graph, plain, layer), _costs(graph, nest, layer)
            before = 0
            for r in layer:
                self.delta[r] = (n_peak[r] - before - p_peak[r], n_cost[r] - p_cost[r], rng[r])
                before += rng[r]

    @property
    def any(self) -> bool:
        return bool(self.delta)

    def runs(self, i: int, a: int, ends: list[int], js: np.ndarray, floor: np.ndarray, cost: np.ndarray,
             ret: np.ndarray, m: int) -> tuple[np.ndarray, ...]:
        """``(segs, floor, run_cost, ret, choice)`` of the nested regions among the plain candidates ``js`` of
        first stage ``i`` (node ``a``), aligned with their ``floor``, ``cost`` and ``ret``."""
        out = []
        for x, j in enumerate(js.tolist()):
            d = self.delta.get((a, ends[j]))
            if d is not None:
                out.append((j, int(floor[x]) + d[0], int(cost[x]) + d[1], int(ret[x]) + d[2], j + m * NESTED_CODE))
        if not out:
            e = np.zeros(0, np.int64)
            return e, e, e, e, e
        cols = np.array(out, dtype=np.int64).T
        return tuple(np.ascontiguousarray(c) for c in cols)


def _layers(regions: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """``regions`` (sorted) in as few lists of disjoint regions as a greedy pass finds."""
    layers: list[list[tuple[int, int]]] = []
    for r in regions:
        for layer in layers:
            if layer[-1][1] < r[0]:
                layer.append(r)
                break
        else:
            layers.append([r])
    return layers


def _peaks(sim, layer: list[tuple[int, int]]) -> dict[tuple[int, int], int]:  # noqa: ANN001
    """The highest live bytes at the steps of each region of ``layer`` (its nodes' forward, recompute, backward)."""
    starts = [a for a, _ in layer]
    out = {r: -1 for r in layer}
    for (_, k), live in zip(sim.steps, sim.live_bytes):
        x = bisect.bisect_right(starts, k) - 1
        if x >= 0 and k <= layer[x][1] and live > out[layer[x]]:
            out[layer[x]] = live
    return out


def _costs(graph: Graph, sim, layer: list[tuple[int, int]]) -> dict[tuple[int, int], int]:  # noqa: ANN001
    """Each region's share of ``sim.recompute_cost``: the cost of its recompute steps."""
    costs = graph.recompute_costs()
    starts = [a for a, _ in layer]
    out = {r: 0 for r in layer}
    for phase, k in sim.steps:
        if phase == "recompute":
            x = bisect.bisect_right(starts, k) - 1
            if x >= 0 and k <= layer[x][1]:
                out[layer[x]] += costs[k]
    return out
