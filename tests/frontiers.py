"""Brute force's Pareto fronts, each computed once per test session.

Several test files hold solvers against ``solvers.brute_force.pareto_frontier`` on the same small graphs
(``test_cpsat_selective`` takes ``test_selective_exact``'s cases, and within a file several tests walk one
case); simulating every plan of a graph is the larger part of those tests' time. Keyed by the graph's
content hash (costs and spans included) and the options, so a changed graph is never served an old front.
"""

from __future__ import annotations

from typing import Any

from graphs import Graph
from solvers.brute_force import FrontierPoint
from solvers.brute_force import pareto_frontier as _brute_force_frontier

__all__ = ["pareto_frontier"]

_FRONTS: dict[tuple, tuple[FrontierPoint, ...]] = {}


def pareto_frontier(graph: Graph, **options: Any) -> list[FrontierPoint]:
    """``solvers.brute_force.pareto_frontier(graph, **options)``, a fresh list each call."""
    key = (graph.content_hash(), tuple(sorted(options.items())))
    if key not in _FRONTS:
        _FRONTS[key] = tuple(_brute_force_frontier(graph, **options))
    return list(_FRONTS[key])
