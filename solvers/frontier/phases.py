"""``ilp``'s frontier-program phases: the exact program (with and without kept nodes) and its bounded-width
heuristic for wide graphs (NOTE [ The frontier DP ] in ``solvers.frontier.program``).

NOTE [ The heuristic's first pass ]
    On a graph too wide for the exact program where no fast solver's plan
    fits, CP-SAT starts from nothing, and on random-dag 300 at 0.6 it finds
    no plan in 50 s by itself; it finds one when hinted with the bounded-width
    program's plan (``frontier_heuristic``, max_free 0: 1.6 s idle). That
    heuristic once had only what was left of the first tenth of the limit
    (:data:`HEURISTIC_SHARE`) after the warm starts: about 2 s
    of 60 idle, nothing on a busy machine (``benchmarks/results/solvers.md`` then read
    "no plan" where it had read 23.18 %), and at a 14 s limit nothing even
    idle. Its passes until one finds a plan (max_free 0, or 2 on random-dag
    100 at 0.6) may now run until half of the time left
    (:data:`FIRST_PASS_KEEP`) or to the end of that tenth, whichever is
    later; the passes after, which only make the plan cheaper, keep the tenth.
    The search with kept nodes starts from that plan too
    (:func:`heuristic_start`): a stock T5 at its least budget, where no fast
    solver's plan fits, once answered "no plan found" at 20 s on a busy
    machine, its kept-node search having found none by itself, where the
    heuristic finds one in 0.2 s.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from graphs import Graph

from ..deadline import Deadline
from ..errors import InfeasibleBudget, SolverBug
from .program import MAX_WIDTH, FrontierDP, FrontierTimeout
from ..model.plan import Plan, Status
from ..model.simulate import simulate
from ..warm import Incumbent, simple_peaks

__all__ = ["frontier_program", "keepable", "by_frontier", "frontier_heuristic", "heuristic_start", "HEURISTIC_SHARE",
           "FIRST_PASS_KEEP"]

log = logging.getLogger(__name__)

#: The share of the time limit (and of the work limit) the bounded-width heuristic may take (wide graphs).
HEURISTIC_SHARE = 0.1
#: The share of the time left that the heuristic's passes keep for CP-SAT until one finds a plan (where that is less).
FIRST_PASS_KEEP = 0.5

_PROGRAMS: dict[tuple[int, int | None, bool, bool, bool], tuple[Any, FrontierDP]] = {}


def keepable(graph: Graph) -> bool:
    """Some node may be kept by a selective plan (saveable, of positive recompute cost)."""
    return any(s and c > 0 for s, c in zip(graph.saveable, graph.recompute_costs()))


def frontier_program(graph: Graph, *, max_width: int | None = MAX_WIDTH, blocks: bool = True,
                     selective: bool = False, nested: bool = False) -> FrontierDP:
    """The frontier program of ``graph``, kept for the next call on the same graph object
    (a chain's block fronts do not depend on the budget: a sweep builds them once).

    Raises:
        TooWide: more than ``max_width`` tensors open at one position (decided in linear time).
    """
    key = (id(graph), max_width, blocks, selective, nested)
    got = _PROGRAMS.get(key)
    if got is not None and got[0]() is graph:
        return got[1]
    program = FrontierDP(graph, max_width=max_width, blocks=blocks, selective=selective, nested=nested)
    if len(_PROGRAMS) >= 4:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = (weakref.ref(graph), program)
    return program


def by_frontier(graph: Graph, budget_bytes: int, program: FrontierDP, deadline: Deadline, *,
                max_work: int | None, upper: int | None = None) -> Plan:
    """The optimum by the frontier program (NOTE [ The frontier DP ]) over the plans it searches (kept nodes
    with a selective program), ``optimal`` with its findings.

    Args:
        deadline: the program stops when it passes.
        max_work: the program's work limit (NOTE [ The frontier program's work ]).
        upper: the cost of a plan known to fit that the program may keep (it prunes above it).

    Raises:
        InfeasibleBudget: no plan of the program fits; carries its least peak (by the same program).
        FrontierTimeout: the program stopped at its work limit or the deadline.
        SolverBug: the program disagrees with ``simulate`` (logged: the caller falls back).
    """
    res = program.solve(budget_bytes, upper=upper, deadline=deadline, max_work=max_work)
    work = program.work
    if res is None:
        if upper is not None:
            log.error("ilp frontier program finds no plan at or under %d, the cost of a plan that fits", upper)
            raise SolverBug("the frontier program rejects a plan that fits")
        # No plan fits: the least peak, by the same program, bounded by two plans' peaks.
        top = min(peak for peak, _ in simple_peaks(graph))
        least = program.solve(top, objective="peak", deadline=deadline,
                              max_work=None if max_work is None else max(0, max_work - work))
        if least is not None and least.objective > budget_bytes:
            raise InfeasibleBudget(budget_bytes, least.objective, solver="ilp", best_regions=least.regions,
                                   best_inner=least.inner, best_saved=least.saved)
        log.error("ilp frontier program found no plan under %d, yet its least peak is %s", budget_bytes,
                  None if least is None else least.objective)
        raise SolverBug("the frontier program's least peak fits the budget it found no plan under")
    sim = simulate(graph, Plan(regions=res.regions, saved=res.saved, inner=res.inner), record=False)
    calls = program.call * len(res.regions)  # NOTE [ Plan overheads ]: the objective prices each region's call
    if sim.peak_bytes > budget_bytes or sim.recompute_cost + calls != res.objective:
        log.error("ilp frontier program predicted %d FLOPs (%d of them region calls) under %d for %s keeping %s "
                  "nesting %s; simulate says %d FLOPs at %d", res.objective, calls, budget_bytes, res.regions,
                  res.saved, res.inner, sim.recompute_cost, sim.peak_bytes)
        raise SolverBug("the frontier program's plan disagrees with simulate")
    method = "frontier with kept nodes" if program.kept is not None else "frontier"
    if program.nested is not None:
        method += " and nested regions" if program.kept is not None else " with nested regions"
    findings: dict[str, Any] = {"method": method, "frontier_states": res.states, "frontier_work": work}
    if res.blocks:
        findings["blocks_composed"] = res.blocks  # NOTE [ Composing repeated blocks ]
    if calls:
        findings["objective_calls"] = calls
    return Plan(regions=res.regions, saved=res.saved, inner=res.inner, status=Status.OPTIMAL,
                bound=float(res.objective - calls), findings=findings)


def frontier_heuristic(graph: Graph, budget_bytes: int, deadline: Deadline, max_work: int | None,
                       first: Deadline | None = None) -> Incumbent | None:
    """A plan for a graph too wide for the exact program: the program with at
    most ``k`` unheld open tensors per boundary (the rest counted as held, so
    the plan fits), for ``k`` = 0, 2, 4, 8 while the time and the work last; the cheapest.

    ``first``: the deadline of the program's build and of its passes until one finds a plan (default
    ``deadline``), which may be later than the others': that plan is often the only one a wide graph gets (NOTE
    [ The heuristic's first pass ]); the later passes only make it cheaper."""
    first = deadline if first is None else first
    try:  # on a graph this wide the open sets alone are millions of entries: built only when there is time
        program = FrontierDP(graph, max_width=None, blocks=False, deadline=first)
    except (FrontierTimeout, MemoryError) as exc:
        log.info("ilp heuristic: %s", exc or type(exc).__name__)
        return None
    best: Incumbent | None = None
    spent = 0
    for k in (0, 2, 4, 8):
        now = first if best is None else deadline
        if now.expired():
            break
        try:
            res = program.solve(budget_bytes, max_free=k, deadline=now,
                                max_work=None if max_work is None else max_work - spent,
                                upper=best.flops if best is not None else None)
        except (FrontierTimeout, MemoryError) as exc:
            log.info("ilp heuristic (max_free %d): %s", k, exc or type(exc).__name__)
            break
        finally:
            spent += program.work
        if res is None:
            log.info("ilp heuristic (max_free %d): no plan%s", k, " cheaper" if best is not None else "")
            continue
        sim = simulate(graph, Plan(regions=res.regions), record=False)
        if sim.peak_bytes <= budget_bytes and (best is None or sim.recompute_cost < best.flops):
            best = Incumbent(res.regions, int(sim.recompute_cost), f"frontier (max_free {k})")
    return best


def heuristic_start(graph: Graph, budget_bytes: int, deadline: Deadline, max_work: int | None) -> Incumbent | None:
    """:func:`frontier_heuristic` within ``ilp``'s limits: a plan for CP-SAT to start from where no fast solver's
    fits (NOTE [ The heuristic's first pass ]); ``max_work``: the program's work limit, or None."""
    keep = (1 - HEURISTIC_SHARE) * deadline.limit_s
    inc = frontier_heuristic(graph, budget_bytes, deadline.before(keep),
                             None if max_work is None else int(HEURISTIC_SHARE * max_work),
                             first=deadline.before(min(keep, FIRST_PASS_KEEP * deadline.left())))
    if inc is not None:
        log.info("ilp warm start: %s, %d FLOPs", inc.source, inc.flops)
    return inc
