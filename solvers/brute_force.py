"""Exhaustive search over every interval plan: the oracle for small graphs.

A graph of ``n`` nodes has F(2n+1) interval plans (F: Fibonacci), 10,946 for
10 nodes and 75,025 for 12, each costed by :func:`~solvers.model.simulate.simulate`.
With ``selective`` (the default) every region also tries each kept set of its
menu (NOTE [ The menu of kept sets ] in ``solvers.model.selective``): a plan is a
set of ``(region, menu entry)`` pairs, and the optimum is over those pairs.
On a graph without saveable nodes every menu is ``()`` and nothing changes.
With ``nested`` every region that keeps no nodes is also tried nested with
its child calls inside (NOTE [ The menu of inner regions ] in
``solvers.model.nested``).
"""

from __future__ import annotations

import itertools
import time
from typing import Iterator

from graphs import Graph

from .errors import InfeasibleBudget, SolverInputError
from .model.plan import Plan, Status
from .model.selective import DEFAULT_LIMIT, variants
from .model.simulate import simulate
from .model.nested import inner_menu

__all__ = ["MAX_BRUTE_FORCE_NODES", "MAX_BRUTE_FORCE_PLANS", "FrontierPoint", "enumerate_plans",
           "enumerate_selective", "enumerate_nested", "count_selective", "pareto_frontier", "best_from_frontier", "brute_force"]

#: Refuse larger graphs: 14 nodes already means 317,811 simulations.
MAX_BRUTE_FORCE_NODES = 14
#: Refuse to simulate more ``(regions, kept set)`` plans than this.
MAX_BRUTE_FORCE_PLANS = 2_000_000

Regions = tuple[tuple[int, int], ...]


class FrontierPoint(tuple):
    """One point of :func:`pareto_frontier`: the triple ``(peak_bytes,
    recompute_cost, regions)`` (what callers unpack) with the plan's kept
    nodes as :attr:`saved` (sorted positions, ``()`` without selective recompute)
    and its inner regions as :attr:`inner` (``()`` without nesting)."""

    saved: tuple[int, ...]
    inner: Regions

    def __new__(cls, peak: int, cost: int, regions: Regions, saved: tuple[int, ...] = (),
                inner: Regions = ()) -> "FrontierPoint":
        self = super().__new__(cls, (peak, cost, regions))
        self.saved = tuple(saved)
        self.inner = tuple(inner)
        return self

    def __repr__(self) -> str:
        return (f"FrontierPoint(peak={self[0]}, cost={self[1]}, regions={self[2]}, saved={self.saved}"
                + (f", inner={self.inner})" if self.inner else ")"))


def enumerate_plans(graph: Graph) -> Iterator[tuple[tuple[int, int], ...]]:
    """Yield every set of disjoint regions (as sorted tuples) over ``graph``,
    skipping regions that contain a node marked ``recomputable=False`` and,
    on a graph with spans, regions that are no span (NOTE [ Module-aligned regions ])."""
    n = len(graph)
    ok = [nd.recomputable for nd in graph.nodes]
    allowed = graph.allowed_regions()

    def rec(i: int, acc: tuple[tuple[int, int], ...]) -> Iterator[tuple[tuple[int, int], ...]]:
        if i >= n:
            yield acc
            return
        yield from rec(i + 1, acc)
        j = i
        while j < n and ok[j]:
            if allowed is None or (i, j) in allowed:
                yield from rec(j + 1, acc + ((i, j),))
            j += 1

    return rec(0, ())


def enumerate_selective(graph: Graph, *, limit: int = DEFAULT_LIMIT) -> Iterator[tuple[Regions, tuple[int, ...]]]:
    """Yield ``(regions, saved)`` for every interval plan of :func:`enumerate_plans`
    and every choice of one menu entry per region (:func:`~solvers.model.selective.variants`)."""
    costs, saveable = graph.recompute_costs(), graph.saveable
    menus: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    for regions in enumerate_plans(graph):
        lists = []
        for r in regions:
            if r not in menus:
                menus[r] = variants(graph, r[0], r[1], limit=limit, costs=costs, saveable=saveable)
            lists.append(menus[r])
        for combo in itertools.product(*lists):
            yield regions, tuple(sorted(k for entry in combo for k in entry))


def enumerate_nested(graph: Graph, plans: Iterator[tuple[Regions, tuple[int, ...]]], *, every: bool = False
                     ) -> Iterator[tuple[Regions, tuple[int, ...], Regions]]:
    """Yield ``(regions, saved, inner)``: each plan of ``plans`` with every choice of nesting its regions
    that keep no nodes and have child calls (NOTE [ The menu of inner regions ] in ``solvers.model.nested``).

    ``every``: instead, every set of disjoint regions strictly inside each such region (spans on a graph
    with spans, any interval without), the whole depth-2 space the menu restricts."""
    for regions, saved in plans:
        free = [r for r in regions if not any(r[0] <= k <= r[1] for k in saved)]
        if every:
            lists = [[x for x in _inside(graph, r) if x != (r,)] for r in free]
            for combo in itertools.product(*lists):
                yield regions, saved, tuple(sorted(x for sets in combo for x in sets))
            continue
        opts = [r for r in free if inner_menu(graph, *r)]
        for flags in itertools.product((False, True), repeat=len(opts)):
            yield regions, saved, tuple(x for r, f in zip(opts, flags) if f for x in inner_menu(graph, *r))


def _inside(graph: Graph, region: tuple[int, int]) -> list[Regions]:
    """Every set of disjoint allowed regions within ``region`` (``()`` included)."""
    a, b = region
    allowed = graph.allowed_regions()
    ok = [nd.recomputable for nd in graph.nodes]
    out: list[Regions] = []

    def rec(i: int, acc: Regions) -> None:
        if i > b:
            out.append(acc)
            return
        rec(i + 1, acc)
        j = i
        while j <= b and ok[j]:
            if allowed is None or (i, j) in allowed:
                rec(j + 1, acc + ((i, j),))
            j += 1

    rec(a, ())
    return out


def count_selective(graph: Graph, *, limit: int = DEFAULT_LIMIT) -> int:
    """How many plans :func:`enumerate_selective` yields (without simulating them)."""
    n = len(graph)
    costs, saveable = graph.recompute_costs(), graph.saveable
    ok = [nd.recomputable for nd in graph.nodes]
    allowed = graph.allowed_regions()
    ways = [0] * (n + 1)  # ways[i]: plans over nodes i..n-1, counting menu entries
    ways[n] = 1
    for i in range(n - 1, -1, -1):
        total = ways[i + 1]
        j = i
        while j < n and ok[j]:
            if allowed is None or (i, j) in allowed:
                total += len(variants(graph, i, j, limit=limit, costs=costs, saveable=saveable)) * ways[j + 1]
            j += 1
        ways[i] = total
    return ways[0]


def pareto_frontier(graph: Graph, *, selective: bool = True, limit: int = DEFAULT_LIMIT,
                    nested: bool | str = False) -> list[FrontierPoint]:
    """Every plan's ``(peak_bytes, recompute_cost)``, reduced to the frontier.

    Args:
        graph: at most :data:`MAX_BRUTE_FORCE_NODES` nodes.
        selective: also try every region's menu of kept sets (NOTE [ The menu
            of kept sets ] in ``solvers.model.selective``); False: regions only.
        limit: the menus' size.
        nested: also try every region that keeps nothing nested with its
            child calls (``Plan.inner``, NOTE [ The menu of inner regions ]);
            ``"every"``: with every set of disjoint regions inside it (the
            whole depth-2 space; tiny graphs only).

    Returns:
        :class:`FrontierPoint` ``(peak, cost, regions)`` with ``.saved`` and ``.inner``, sorted
        by ascending peak and strictly descending cost: for any budget, the
        optimum is the last entry whose peak is within budget
        (:func:`best_from_frontier`). Ties on cost keep the lowest peak, then
        the fewest regions, then the fewest kept nodes, then the fewest inner regions.

    Raises:
        SolverInputError (a ValueError): more than :data:`MAX_BRUTE_FORCE_NODES` nodes, or more
            than :data:`MAX_BRUTE_FORCE_PLANS` plans to simulate.
    """
    if len(graph) > MAX_BRUTE_FORCE_NODES:
        raise SolverInputError(
            f"brute force enumerates every plan and is limited to {MAX_BRUTE_FORCE_NODES} nodes; "
            f"this graph has {len(graph)}. Use solver 'dp' or 'ilp'."
        )
    rows = []
    if selective:
        total = count_selective(graph, limit=limit)
        if total > MAX_BRUTE_FORCE_PLANS:
            raise SolverInputError(f"brute force with selective recompute would simulate {total} plans (the limit is "
                             f"{MAX_BRUTE_FORCE_PLANS}); pass a smaller limit, selective=False, or a smaller graph")
        plans: Iterator[tuple[Regions, tuple[int, ...]]] = enumerate_selective(graph, limit=limit)
    else:
        plans = ((regions, ()) for regions in enumerate_plans(graph))
    triples = (enumerate_nested(graph, plans, every=nested == "every") if nested
               else ((r, s, ()) for r, s in plans))
    for regions, saved, inner in triples:
        sim = simulate(graph, Plan(regions=regions, saved=saved, inner=inner), record=False)
        rows.append((sim.peak_bytes, sim.recompute_cost, len(regions), regions, len(saved), saved, len(inner), inner))
    rows.sort()
    frontier: list[FrontierPoint] = []
    for peak, cost, _, regions, _, saved, _, inner in rows:
        if not frontier or cost < frontier[-1][1]:
            frontier.append(FrontierPoint(peak, cost, regions, saved, inner))
    return frontier


def best_from_frontier(frontier, budget_bytes: int):
    """The frontier entry with least cost whose peak fits, or None.

    Args:
        frontier: a :func:`pareto_frontier`.
        budget_bytes: the whole step's budget.

    Returns:
        That entry itself (a :class:`FrontierPoint` keeps its ``saved``), or None.
    """
    best = None
    for point in frontier:
        if point[0] <= budget_bytes:
            best = point
        else:
            break
    return best


def brute_force(graph: Graph, budget_bytes: int, *, selective: bool = True, limit: int = DEFAULT_LIMIT,
                nested: bool = False, frontier=None) -> Plan:
    """The cheapest plan whose simulated peak fits ``budget_bytes``.

    Args:
        graph: at most :data:`MAX_BRUTE_FORCE_NODES` nodes.
        budget_bytes: the whole step's budget.
        selective: regions may keep menu entries (NOTE [ The menu of kept
            sets ] in ``solvers.model.selective``); False: regions only, as
            without selective recompute.
        limit: the menus' size.
        nested: regions may also nest their child calls (NOTE [ The menu of
            inner regions ] in ``solvers.model.nested``).
        frontier: a precomputed :func:`pareto_frontier` (then ``selective``
            and ``limit`` are those it was computed with), to answer many budgets.

    Returns:
        An ``optimal`` plan; ties on recompute are broken by lower peak, then
        by fewer regions, then by fewer kept nodes. ``saved`` holds its kept nodes.

    Raises:
        SolverInputError (a ValueError): the graph is too large to enumerate (see :func:`pareto_frontier`).
        InfeasibleBudget: no plan fits; carries the least feasible budget.
    """
    t0 = time.perf_counter()
    if frontier is None:
        frontier = pareto_frontier(graph, selective=selective, limit=limit, nested=nested)
    best = best_from_frontier(frontier, budget_bytes)
    if best is None:
        raise InfeasibleBudget(budget_bytes, frontier[0][0], solver="brute-force", best_regions=frontier[0][2])
    peak, cost, regions = best[:3]
    saved = getattr(best, "saved", ())
    inner = getattr(best, "inner", ())
    flops = simulate(graph, Plan(regions=tuple(regions), saved=saved, inner=inner), record=False).recompute_flops
    return Plan.from_regions(
        graph, regions, solver="brute-force", status=Status.OPTIMAL, budget_bytes=int(budget_bytes),
        peak_bytes=peak, recompute_cost=cost, recompute_flops=flops, bound=float(cost),
        gap=0.0, solve_time_s=time.perf_counter() - t0, saved=saved, inner=inner,
        options={**({"selective": bool(selective), "limit": limit} if selective else {}),
                 **({"nested": True} if nested else {})},
    )
