"""Fewer regions where a region's call costs more than it saves (NOTE [ Merging regions for their overhead ]).

NOTE [ Merging regions for their overhead ]
    The exact solvers minimise recompute; each region also costs a call
    (``region_s``, NOTE [ Plan overheads ] in ``solvers.model.overheads``),
    which their objectives do not see. So after a solver answers,
    :func:`fewer_regions` replaces a run of consecutive regions by one
    region covering them (the smallest allowed interval holding the run: a
    module call on a module-aligned graph, any interval otherwise) when the
    plan still fits the budget and its total cost (recompute plus overheads)
    is lower: two sibling regions that tile their parent call become the
    parent, at the same recompute and one call less. It is greedy (the best
    single merge, repeated) and only on one-level plans without kept nodes
    or chunks (a chunked or nested plan keeps its solver's regions). A graph
    without overhead figures is left as solved. The plan's status refers to
    its recompute (the solver's proof), so a plan proven optimal is merged
    only where the merge adds no recompute (it stays optimal); a plan only
    feasible may trade a little recompute for fewer calls.
"""

from __future__ import annotations

import dataclasses
import logging

from graphs import Graph

from .model.overheads import graph_overheads
from .model.plan import Plan, Status
from .model.simulate import simulate

__all__ = ["fewer_regions"]

log = logging.getLogger(__name__)


def _cover(graph: Graph, a: int, b: int) -> tuple[int, int] | None:
    """The smallest allowed interval holding ``[a, b]`` with only recomputable nodes, or None."""
    allowed = graph.allowed_regions()
    if allowed is None:
        cand = (a, b)
    else:
        holding = [r for r in allowed if r[0] <= a and b <= r[1]]
        if not holding:
            return None
        cand = min(holding, key=lambda r: r[1] - r[0])
    if not all(graph.nodes[i].recomputable for i in range(cand[0], cand[1] + 1)):
        return None
    return cand


def fewer_regions(graph: Graph, plan: Plan, budget_bytes: int, *, widest: int = 8, tries: int = 200) -> Plan:
    """``plan`` with runs of up to ``widest`` consecutive regions merged while that lowers the total cost and
    fits ``budget_bytes`` (NOTE [ Merging regions for their overhead ]); at most ``tries`` plans simulated.

    A merge is simulated only when the recompute it adds (the cover's nodes outside every region) is below the
    calls it saves, so on most plans nothing is simulated at all."""
    o = graph_overheads(graph)
    if o is None or not o.region_s or plan.saved or plan.inner or plan.chunks or len(plan.regions) < 2:
        return plan
    rate = (graph.meta.get("costs") or {}).get("flops_per_s") or 0
    call = o.region_s * float(rate)
    costs = graph.recompute_costs()
    proven = plan.status == Status.OPTIMAL
    regions = list(plan.regions)
    best_total = simulate(graph, plan, record=False).total_cost
    merged = 0
    while len(regions) > 1 and tries > 0:
        found = None
        for i in range(len(regions) - 1):
            for j in range(i + 1, min(len(regions), i + widest)):
                cover = _cover(graph, regions[i][0], regions[j][1])
                if cover is None:
                    continue
                trial = [r for r in regions if r[1] < cover[0] or r[0] > cover[1]] + [cover]
                if any(r[0] <= cover[1] and cover[0] <= r[1] for r in trial[:-1]):
                    continue  # a region partly inside the cover
                inside = [r for r in regions if cover[0] <= r[0] and r[1] <= cover[1]]
                added = sum(costs[cover[0]:cover[1] + 1]) - sum(sum(costs[a:b + 1]) for a, b in inside)
                if added >= call * (len(inside) - 1) or tries <= 0 or (added > 0 and proven):
                    continue  # an optimal plan's recompute stays optimal: only merges that add none
                tries -= 1
                cand = dataclasses.replace(plan, regions=tuple(sorted(trial)))
                sim = simulate(graph, cand, record=False)
                if sim.peak_bytes <= budget_bytes and sim.total_cost < best_total and \
                        (found is None or sim.total_cost < found[0]):
                    found = (sim.total_cost, sorted(trial))
        if found is None:
            break
        best_total, regions = found
        merged += 1
    if not merged:
        return plan
    log.info("merged regions for their overhead: %d -> %d regions", len(plan.regions), len(regions))
    return dataclasses.replace(plan, regions=tuple(regions),
                               findings={**plan.findings, "regions_merged": len(plan.regions) - len(regions)})
