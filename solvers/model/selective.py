"""Selective recompute inside a region: which kept sets the solvers consider.

NOTE [ The menu of kept sets ]
    A region with ``s`` saveable nodes (``Graph.saveable``) could keep any of
    ``2**s`` subsets (NOTE [ Selective recompute ] in ``solvers.model.simulate``
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

    Nor is a node the recompute never reaches (:func:`recompute_reach`).
    Non-reentrant checkpoint stops a region's recompute as soon as the last
    tensor the region saved has been saved again (early stop), so nodes
    after the region's last node that saves something (:func:`last_savers`:
    requires grad, and saves an input, its output or buffers of its own)
    never run again: keeping one would save no cost, and its cached copy
    would stay held until the region's backward ends instead of the step
    ``solvers.model.simulate`` frees it at. That last saver's own call is reached
    only when it saves something the call makes (its output, its own
    buffers): autograd packs an op's *inputs* before the op runs, so when
    it saves only inputs the recompute stops inside it, before the call,
    and the cache that holds its kept output is never read. Measured on
    timm's ViT (``mlp.fc2``, then ``Dropout(p=0)``, which is no op, and the
    residual add, which saves nothing): a kept ``fc2`` output stayed alive
    to the end of its block's backward, 798,720 bytes above ``simulate``
    (``tests/regressions/test_timm_vit_kept_fc2.py``). ``Plan.validate``
    refuses a plan that keeps such a node. A node a policy cannot select
    (``Graph.saveable`` false: NOTE [ Which op a policy keeps ] in
    ``scheduler.tracing.recorder``) is never offered either.
"""

from __future__ import annotations

import bisect
import functools
from typing import Callable, Sequence

from graphs import Graph

from ..errors import SolverInputError

__all__ = ["DEFAULT_LIMIT", "variants", "ranked_saveable", "menu_lengths", "GrowingMenus", "last_savers",
           "recompute_reach"]

#: Default size of a region's menu, ``()`` included.
DEFAULT_LIMIT = 4


def last_savers(graph: Graph) -> list[int]:
    """Per position ``b``: the last node at or before ``b`` that saves a tensor for its backward, or -1.

    A region ``first..last``'s recompute stops in that node, once it has
    saved again what it saved (NOTE [ The menu of kept sets ];
    :func:`recompute_reach` says whether its own call ran).
    """
    out = []
    prev = -1
    for i, nd in enumerate(graph.nodes):
        if nd.requires_grad and (nd.saves_inputs or nd.saves_output or nd.saved_bytes > 0):
            prev = i
        out.append(prev)
    return out


def recompute_reach(graph: Graph) -> list[int]:
    """Per position ``b``: the last node whose call a recompute of a region ending at ``b`` runs, or -1.

    That is ``last_savers(graph)[b]`` when that node saves its output or
    buffers of its own (packed after its call), else the node before it
    (it saves only inputs, packed before its call: the recompute stops
    there). A node kept past it is never read from the cache (NOTE [ The
    menu of kept sets ]).
    """
    nodes = graph.nodes
    out = []
    for last in last_savers(graph):
        if last >= 0 and not (nodes[last].saves_output or nodes[last].saved_bytes > 0):
            last -= 1
        out.append(last)
    return out


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
    reached = recompute_reach(graph)[last]
    cands = [k for k in range(first, reached + 1) if saveable[k] and costs[k] > 0]
    return sorted(cands, key=functools.cmp_to_key(_comparator(graph, costs)))


def _comparator(graph: Graph, costs: Sequence[int]) -> Callable[[int, int], int]:
    """The ranking of NOTE [ The menu of kept sets ] as a comparison of two node positions:
    a total order, so a region's ranking is the graph's ranking restricted to it."""
    nodes = graph.nodes

    def better(x: int, y: int) -> int:
        # cost[x] / size[x] against cost[y] / size[y], exactly (a size of 0 is an infinite ratio)
        sx, sy = nodes[x].out_bytes + nodes[x].saved_bytes, nodes[y].out_bytes + nodes[y].saved_bytes
        lhs, rhs = costs[x] * sy, costs[y] * sx
        if lhs != rhs:
            return -1 if lhs > rhs else 1
        return -1 if x < y else (1 if x > y else 0)

    return better


def menu_lengths(size: int, limit: int) -> list[int]:
    """The prefix lengths of a ranking of ``size`` nodes that a menu of ``limit`` entries takes."""
    lengths = []
    p = 1
    while p < size:
        lengths.append(p)
        p *= 2
    if size:
        lengths = lengths[:max(0, limit - 2)] + [size]
    return lengths[:limit - 1]


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
    _check_limit(limit)
    ranked = ranked_saveable(graph, first, last, costs=costs, saveable=saveable)
    return [()] + [tuple(sorted(ranked[:m])) for m in menu_lengths(len(ranked), limit)]


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SolverInputError(f"limit must be an integer >= 1 (the menu always holds ()), got {limit!r}")


class GrowingMenus:
    """The menus of the regions ``first..last`` for one ``first`` and growing
    ``last``, equal to :func:`variants` (for a solver asking thousands of regions).

    The ranking is a total order, so each region's ranking is the graph's
    ranking (computed once) restricted to it: nodes are inserted by rank as
    ``last`` grows.
    """

    def __init__(self, graph: Graph, *, limit: int = DEFAULT_LIMIT, costs: Sequence[int] | None = None) -> None:
        _check_limit(limit)
        self.limit = limit
        costs = graph.recompute_costs() if costs is None else costs
        cands = [k for k, nd in enumerate(graph.nodes) if nd.sac_op >= 0 and costs[k] > 0]
        order = sorted(cands, key=functools.cmp_to_key(_comparator(graph, costs)))
        self.rank = {k: r for r, k in enumerate(order)}
        self.reach = recompute_reach(graph)
        self._first = -1
        self._last = -1
        self._upto = -1
        self._ranks: list[int] = []

    def of(self, first: int, last: int) -> list[tuple[int, ...]]:
        """The menu of ``first..last``; ``last`` may only grow for one ``first``.

        Args:
            first, last: the region.

        Returns:
            ``variants(graph, first, last, limit=limit)``.
        """
        if first != self._first or last < self._last:
            self._first, self._last, self._upto, self._ranks = first, first - 1, first - 1, []
        upto = self.reach[last]  # the recompute runs no call after this node's (NOTE [ The menu of kept sets ])
        for k in range(self._upto + 1, upto + 1):
            r = self.rank.get(k)
            if r is not None:
                bisect.insort(self._ranks, r)
        self._upto = max(self._upto, upto)
        self._last = last
        order = self.order
        return [()] + [tuple(sorted(order[r] for r in self._ranks[:m]))
                       for m in menu_lengths(len(self._ranks), self.limit)]

    @functools.cached_property
    def order(self) -> dict[int, int]:
        """Rank -> node position."""
        return {r: k for k, r in self.rank.items()}
