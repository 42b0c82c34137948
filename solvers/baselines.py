"""Baselines users know: store everything, and k equal regions.

* ``store-all``: no checkpointing at all.
* ``uniform``: the node order cut into ``k`` equal segments, every segment
  but the last checkpointed, which is what ``checkpoint_sequential(fns, k)``
  does. Without ``k``, the cheapest ``k`` that fits is chosen.
"""

from __future__ import annotations

from graphs import Graph

from .errors import InfeasibleBudget
from .plan import Plan, Status
from .registry import register
from .simulate import simulate

__all__ = ["store_all", "uniform", "uniform_regions"]


@register("store-all")
def store_all(graph: Graph, budget_bytes: int) -> Plan:
    """No regions. Raises :class:`InfeasibleBudget` if store-all does not fit."""
    sim = simulate(graph, None, record=False)
    if sim.peak_bytes > budget_bytes:
        raise InfeasibleBudget(budget_bytes, sim.peak_bytes, solver="store-all")
    return Plan(regions=(), status=Status.OPTIMAL if sim.recompute_flops == 0 else Status.FEASIBLE)


def uniform_regions(graph: Graph, k: int) -> list[tuple[int, int]]:
    """``k`` near-equal segments of the node order; all but the last become regions.

    Segments whose nodes are not all recomputable are left out.
    """
    n = len(graph)
    k = max(1, min(k, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    regions = []
    for s in range(k - 1):
        a, b = bounds[s], bounds[s + 1] - 1
        if a <= b and all(graph.nodes[i].recomputable for i in range(a, b + 1)):
            regions.append((a, b))
    return regions


@register("uniform")
def uniform(graph: Graph, budget_bytes: int, k: int | None = None) -> Plan:
    """``checkpoint_sequential``-style plan with ``k`` segments.

    Args:
        k: number of segments; ``None`` tries every ``k`` from 1 to n and
            keeps the cheapest plan that fits.
    """
    candidates = [k] if k is not None else range(1, len(graph) + 1)
    best = None
    min_peak = None
    for kk in candidates:
        plan = Plan(regions=tuple(uniform_regions(graph, kk)))
        sim = simulate(graph, plan, record=False)
        min_peak = sim.peak_bytes if min_peak is None else min(min_peak, sim.peak_bytes)
        if sim.peak_bytes <= budget_bytes:
            key = (sim.recompute_flops, sim.peak_bytes)
            if best is None or key < best[0]:
                best = (key, plan, kk)
    if best is None:
        raise InfeasibleBudget(budget_bytes, int(min_peak), solver="uniform")
    _, plan, kk = best
    return Plan(regions=plan.regions, status=Status.FEASIBLE, options={"k": kk})
