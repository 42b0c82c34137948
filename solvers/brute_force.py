"""Exhaustive search over every interval plan: the oracle for small graphs.

A graph of ``n`` nodes has F(2n+1) interval plans (F: Fibonacci), 10,946 for
10 nodes and 75,025 for 12, each costed by :func:`~solvers.simulate.simulate`.
"""

from __future__ import annotations

import time
from typing import Iterator

from graphs import Graph

from .errors import InfeasibleBudget
from .plan import Plan, Status
from .simulate import simulate

__all__ = ["MAX_BRUTE_FORCE_NODES", "enumerate_plans", "pareto_frontier", "best_from_frontier", "brute_force"]

#: Refuse larger graphs: 14 nodes already means 317,811 simulations.
MAX_BRUTE_FORCE_NODES = 14


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


def pareto_frontier(graph: Graph) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """Every plan's ``(peak_bytes, recompute_cost)``, reduced to the frontier.

    Returns ``(peak, cost, regions)`` sorted by ascending peak and strictly
    descending cost: for any budget, the optimum is the last entry whose peak
    is within budget (:func:`best_from_frontier`). Ties on cost
    keep the lowest peak, then the fewest regions.

    Raises:
        ValueError: more than :data:`MAX_BRUTE_FORCE_NODES` nodes.
    """
    if len(graph) > MAX_BRUTE_FORCE_NODES:
        raise ValueError(
            f"brute force enumerates every plan and is limited to {MAX_BRUTE_FORCE_NODES} nodes; "
            f"this graph has {len(graph)}. Use solver 'dp' or 'ilp'."
        )
    rows = []
    for regions in enumerate_plans(graph):
        sim = simulate(graph, Plan(regions=regions), record=False)
        rows.append((sim.peak_bytes, sim.recompute_cost, len(regions), regions))
    rows.sort()
    frontier: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    for peak, cost, _, regions in rows:
        if not frontier or cost < frontier[-1][1]:
            frontier.append((peak, cost, regions))
    return frontier


def best_from_frontier(frontier, budget_bytes: int):
    """The frontier entry with least cost whose peak fits, or None."""
    best = None
    for peak, cost, regions in frontier:
        if peak <= budget_bytes:
            best = (peak, cost, regions)
        else:
            break
    return best


def brute_force(graph: Graph, budget_bytes: int, *, frontier=None) -> Plan:
    """The cheapest interval plan whose simulated peak fits ``budget_bytes``.

    Ties on recompute are broken by lower peak, then by fewer regions. Pass a
    precomputed ``frontier`` (:func:`pareto_frontier`) to answer many budgets.

    Raises:
        ValueError: the graph has more than :data:`MAX_BRUTE_FORCE_NODES` nodes.
        InfeasibleBudget: no plan fits; carries the least feasible budget.
    """
    t0 = time.perf_counter()
    if frontier is None:
        frontier = pareto_frontier(graph)
    best = best_from_frontier(frontier, budget_bytes)
    if best is None:
        raise InfeasibleBudget(budget_bytes, frontier[0][0], solver="brute-force", best_regions=frontier[0][2])
    peak, cost, regions = best
    flops = simulate(graph, Plan(regions=tuple(regions)), record=False).recompute_flops
    return Plan.from_regions(
        graph, regions, solver="brute-force", status=Status.OPTIMAL, budget_bytes=int(budget_bytes),
        peak_bytes=peak, recompute_cost=cost, recompute_flops=flops, bound=float(cost),
        gap=0.0, solve_time_s=time.perf_counter() - t0,
    )
