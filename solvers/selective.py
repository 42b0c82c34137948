"""Selective recompute inside a region: which kept sets the solvers consider.

NOTE [ The menu of kept sets ]
    A region with ``s`` saveable nodes (``Graph.saveable``) could keep any of
    ``2**s`` subsets (NOTE [ Selective recompute ] in ``solvers.simulate``
    says what keeping costs and saves). Every exact solver multiplies its
    region candidates by the kept sets it tries, so trying all subsets is
    exponential per region; instead each region gets a short, deterministic
    *menu* (:func:`variants`) and a plan is a set of ``(region, menu entry)``
    pairs. "Optimal" for ``dp``, ``ilp`` and the brute force then means the
    least recompute cost over those pairs whose simulated peak fits, the same
    menu for every solver, so that the brute force stays their oracle.

    The menu of region ``first..last``:

    * ``()`` first (recompute everything: the plan without selective recompute);
    * the region's saveable nodes whose recompute cost
      (``Graph.recompute_costs()``) is positive are ranked by cost saved per
      byte kept, ``cost[k] / (out_bytes + saved_bytes)`` (a node owning no
      bytes ranks first), ties by position;
    * then the prefixes of that ranking of lengths 1, 2, 4, 8, ... below its
      length, and the whole ranking; when that is more than ``limit - 1``
      entries, the first ``limit - 2`` powers of two and the whole ranking;
    * every entry is a sorted tuple of node positions; no two are equal and
      none but ``()`` saves nothing. A region without a saveable node of
      positive cost has just ``()``.

    A node of zero cost is never offered: keeping it saves nothing and holds
    its bytes from the forward to the recompute.
"""

from __future__ import annotations

import functools
from typing import Sequence

from graphs import Graph

from .errors import SolverInputError

__all__ = ["DEFAULT_LIMIT", "variants", "ranked_saveable"]

#: Default size of a region's menu, ``()`` included.
DEFAULT_LIMIT = 4


def ranked_saveable(graph: Graph, first: int, last: int, *, costs: Sequence[int] | None = None,
                    saveable: Sequence[bool] | None = None) -> list[int]:
    """The region's saveable nodes of positive cost, best cost per byte first.

    Args:
        graph: the cost graph.
        first, last: the region (inclusive node positions).
        costs: ``graph.recompute_costs()`` when already at hand.
        saveable: ``graph.saveable`` when already at hand.

    Returns:
        Node positions ranked as NOTE [ The menu of kept sets ] says.
    """
    costs = graph.recompute_costs() if costs is None else costs
    saveable = graph.saveable if saveable is None else saveable
    nodes = graph.nodes
    cands = [k for k in range(first, last + 1) if saveable[k] and costs[k] > 0]
    size = {k: nodes[k].out_bytes + nodes[k].saved_bytes for k in cands}

    def better(x: int, y: int) -> int:
        # cost[x] / size[x] against cost[y] / size[y], exactly (a size of 0 is an infinite ratio)
        lhs, rhs = costs[x] * size[y], costs[y] * size[x]
        if lhs != rhs:
            return -1 if lhs > rhs else 1
        return -1 if x < y else (1 if x > y else 0)

    return sorted(cands, key=functools.cmp_to_key(better))


def variants(graph: Graph, first: int, last: int, *, limit: int = DEFAULT_LIMIT,
             costs: Sequence[int] | None = None, saveable: Sequence[bool] | None = None) -> list[tuple[int, ...]]:
    """The kept sets to try for the region ``first..last`` (NOTE [ The menu of kept sets ]).

    Args:
        graph: the cost graph.
        first, last: the region, inclusive node positions.
        limit: the most entries, ``()`` included (at least 1).
        costs, saveable: ``graph.recompute_costs()`` and ``graph.saveable``
            when the caller has them (a solver asking for many regions).

    Returns:
        ``[(), ...]``: sorted tuples of node positions, deterministic.

    Raises:
        SolverInputError (a ValueError): ``first..last`` is no interval of the graph, or ``limit < 1``.
    """
    n = len(graph)
    if not (isinstance(first, int) and isinstance(last, int) and 0 <= first <= last < n):
        raise SolverInputError(f"region ({first!r}, {last!r}) is no interval of the graph's {n} nodes: "
                         f"need 0 <= first <= last <= {n - 1}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SolverInputError(f"limit must be an integer >= 1 (the menu always holds ()), got {limit!r}")
    ranked = ranked_saveable(graph, first, last, costs=costs, saveable=saveable)
    size = len(ranked)
    lengths = []
    p = 1
    while p < size:
        lengths.append(p)
        p *= 2
    if size:
        lengths = lengths[:max(0, limit - 2)] + [size]
    menu: list[tuple[int, ...]] = [()]
    for m in lengths[:limit - 1]:
        menu.append(tuple(sorted(ranked[:m])))
    return menu
