"""``chen``: Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost".

Both strategies cut only at articulation cuts (``solvers.model.stages``) and turn
every segment but the last into a region (its input is the checkpoint kept):

* ``chen-sqrt``: about ``sqrt(n)`` segments of equal node count.
* ``chen-greedy``: Chen's Algorithm 3. Walk the stages accumulating the bytes
  of their outputs; once the running sum passes a threshold ``b``, close the
  segment there. Chen searches ``b`` around ``sqrt(x * y)``; here every
  threshold of a fixed geometric grid is tried and the cheapest plan that fits
  (per ``simulate``) is kept.
* ``chen``: the cheapest of both that fits.

The candidate set does not depend on the budget, so a bigger budget never
costs more; none is proven optimal (status ``feasible``). On a graph with
spans every candidate is snapped onto spans (NOTE [ Module-aligned regions ]
in ``graphs.graph``).
"""

from __future__ import annotations

import math
from typing import Iterator

from graphs import Graph

from .errors import InfeasibleBudget, SolverOptionError
from .options import Option
from .model.plan import Plan, Status
from .registry import register
from .model.simulate import simulate
from .model.spans import SpanIndex
from .model.stages import Stages, chain_view, stages

__all__ = ["sqrt_plan", "greedy_plans", "iter_greedy_plans", "chen", "chen_sqrt", "chen_greedy"]

#: Thresholds tried by the greedy, as fractions of the total output bytes.
GREEDY_GRID = 48
#: ``chen``'s modes.
MODES = ("best", "sqrt", "greedy")


def _regions(st: Stages, groups: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Stage groups -> node regions, all but the last, skipping unregionable groups."""
    out = []
    for i, j in groups[:-1]:
        if all(st.regionable[s] for s in range(i, j + 1)):
            out.append((st.starts[i], st.ends[j]))
    return tuple(out)


def sqrt_plan(graph: Graph, segments: int | None = None) -> tuple[tuple[int, int], ...]:
    """About ``sqrt(n)`` segments of equal node count, cut at stage boundaries."""
    st = stages(chain_view(graph))  # NOTE [ Chains and forward holds ]
    n = len(graph)
    k = segments or max(1, round(math.sqrt(n)))
    groups: list[tuple[int, int]] = []
    first = 0
    for s in range(len(st)):
        if st.ends[s] + 1 >= (len(groups) + 1) * n / k or s == len(st) - 1:
            groups.append((first, s))
            first = s + 1
    return _regions(st, groups)


def greedy_plans(graph: Graph) -> list[tuple[tuple[int, int], ...]]:
    """Chen's greedy (Algorithm 3) for a grid of thresholds."""
    return list(dict.fromkeys(iter_greedy_plans(graph)))


def iter_greedy_plans(graph: Graph) -> Iterator[tuple[tuple[int, int], ...]]:
    """:func:`greedy_plans` one threshold at a time (a caller under a deadline stops between them);
    a plan may come more than once."""
    st = stages(chain_view(graph))  # NOTE [ Chains and forward holds ]
    sizes = [sum(graph.nodes[i].out_bytes for i in range(a, b + 1)) for a, b in zip(st.starts, st.ends)]
    total = max(1, sum(sizes))
    for g in range(1, GREEDY_GRID + 1):
        threshold = total * (0.5 ** (GREEDY_GRID - g) if g < GREEDY_GRID // 2 else g / GREEDY_GRID)
        groups, first, acc = [], 0, 0
        for s, size in enumerate(sizes):
            acc += size
            if acc > threshold or s == len(sizes) - 1:
                groups.append((first, s))
                first, acc = s + 1, 0
        yield _regions(st, groups)


def _best(graph: Graph, budget_bytes: int, candidates, solver: str) -> Plan:
    best, least, lowest = None, None, ()
    for regions in candidates:
        sim = simulate(graph, Plan(regions=regions), record=False)
        if least is None or sim.peak_bytes < least:
            least, lowest = sim.peak_bytes, regions
        if sim.peak_bytes <= budget_bytes:
            key = (sim.total_cost, sim.peak_bytes)  # NOTE [ Plan overheads ]
            if best is None or key < best[0]:
                best = (key, regions)
    if best is None:
        raise InfeasibleBudget(budget_bytes, int(least), solver=solver, best_regions=lowest)
    return Plan(regions=best[1], status=Status.FEASIBLE)


@register("chen", options=(Option("mode", str, "sqrt, greedy, or best: the cheapest of both that fits", choices=MODES),))
def chen(graph: Graph, budget_bytes: int, *, mode: str = "best") -> Plan:
    """Chen's plans: ``mode`` is ``sqrt``, ``greedy`` or ``best`` (cheapest that fits).

    On a graph with spans (NOTE [ Module-aligned regions ] in ``graphs.graph``)
    each segment is snapped onto spans (``SpanIndex.snap``: the longest spans
    inside it, or the shortest span around it), so its boundaries are span
    boundaries and every region a span.

    Raises:
        InfeasibleBudget: none of the candidates fits; carries their least peak.
        SolverOptionError: unknown mode.
    """
    if mode not in MODES:  # solve() checks it already; a direct call is checked here
        raise SolverOptionError(f"solver chen: option mode takes {'|'.join(MODES)}, got {mode!r}")
    cands = []
    if mode in ("sqrt", "best"):
        cands.append(sqrt_plan(graph))
    if mode in ("greedy", "best"):
        cands.extend(greedy_plans(graph))
    if graph.spans:
        index = SpanIndex(graph)
        cands = list(dict.fromkeys(snapped for regions in cands for snapped in index.snap(regions)))
    return _best(graph, budget_bytes, cands, f"chen-{mode}" if mode != "best" else "chen")


@register("chen-sqrt")
def chen_sqrt(graph: Graph, budget_bytes: int) -> Plan:
    """Chen's sqrt(n) segmentation at articulation cuts."""
    return chen(graph, budget_bytes, mode="sqrt")


@register("chen-greedy")
def chen_greedy(graph: Graph, budget_bytes: int) -> Plan:
    """Chen's budget-aware greedy (Algorithm 3)."""
    return chen(graph, budget_bytes, mode="greedy")
