"""Solving over nestings: the menu of nested plans (NOTE [ The menu of inner regions ] in ``solvers.model.nested``,
where what a nested plan is, NOTE [ Nested regions ], is stated) searched above the solvers.

NOTE [ Solving nested plans ]
    ``dp`` with ``nested=True`` is exact over the menu below on a chain
    (checked against the brute force). On a DAG its table is an upper bound
    and, for nested regions, not even that (their profiles are read off
    ``simulate`` at one context), so every nested answer it gives is
    simulated. :func:`solve_nested` (``scheduler.solve(..., nested=True)``)
    therefore takes the cheapest that fits of (1) ``dp`` with ``nested=True``,
    (2) the one-level solver asked for (``ilp`` by default: exact over
    one-level plans), (3) when the one-level solver finds nothing, its
    least plan with the nesting of its regions chosen to fit
    (:func:`nest_to_fit`: every choice up to :data:`MAX_FLAG_REGIONS` regions
    with child calls), and (4) when the one-level solver is ``ilp`` or
    ``frontier`` and the graph is within the frontier program's width, the
    frontier program with ``nested=True`` (NOTE [ Nested regions in the
    frontier DP ] in ``solvers.frontier.nested``; with kept sets when
    ``selective``), exact over the menu on any graph it takes. The answer is
    optimal where (1) is (a chain) or where (4) finished within its limits
    (:data:`FRONTIER_TIME_LIMIT_S`, :data:`FRONTIER_WORK_LIMIT`) and nothing
    cheaper was found; then it is ``optimal`` over the menu (a program that
    proves no plan fits raises its least peak, proven). Elsewhere the plan
    says ``feasible``, and it is never worse than the one-level solver.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any, Callable, Sequence

from graphs import CkptError, Graph

from ..deadline import Deadline, stopped
from ..errors import InfeasibleBudget, SolverBug
from ..frontier.front import TooWide
from ..frontier.phases import by_frontier, frontier_program, keepable
from ..frontier.program import WORK_PER_S, FrontierTimeout
from ..model.nested import inner_menu, nested_plan_inner
from ..model.plan import Plan, Status
from ..model.simulate import simulate
from ..registry import finalize, solve

__all__ = ["nest_to_fit", "solve_nested", "MAX_FLAG_REGIONS", "FRONTIER_TIME_LIMIT_S", "FRONTIER_WORK_LIMIT"]

log = logging.getLogger(__name__)

#: :func:`nest_to_fit` tries every choice of nested regions up to this many regions with child calls.
MAX_FLAG_REGIONS = 10
#: :func:`solve_nested`'s frontier program (NOTE [ Solving nested plans ]): its wall-clock limit, and its work
#: limit in about seconds of one idle core (NOTE [ The frontier program's work ]).
FRONTIER_TIME_LIMIT_S = 60.0
FRONTIER_WORK_LIMIT = 30.0


def nest_to_fit(graph: Graph, regions: Sequence[tuple[int, int]], budget_bytes: int, *,
                exhaustive: bool = True) -> tuple[Any, int]:
    """``(plan or None, least peak seen)``: the cheapest nesting of ``regions`` (NOTE [ The menu of inner
    regions ]) whose simulated peak fits ``budget_bytes`` (NOTE [ Solving nested plans ]); -1: nothing nests.

    ``exhaustive=False`` tries each region nested alone and all of them, whatever their number."""
    regions = tuple(sorted(tuple(r) for r in regions))
    opts = [r for r in regions if inner_menu(graph, *r)]
    if exhaustive and len(opts) <= MAX_FLAG_REGIONS:
        choices: Any = itertools.product((False, True), repeat=len(opts))
    else:  # each region nested alone, then all of them
        choices = [(True,) * len(opts)] + [tuple(i == x for i in range(len(opts))) for x in range(len(opts))]
    best, best_cost, least = None, None, None
    for flags in choices:
        if not any(flags):
            continue
        plan = Plan(regions=regions, inner=nested_plan_inner(graph, opts, flags))
        sim = simulate(graph, plan, record=False)
        least = sim.peak_bytes if least is None else min(least, sim.peak_bytes)
        if sim.peak_bytes <= budget_bytes and (best_cost is None or sim.total_cost < best_cost):
            best, best_cost = plan, sim.total_cost  # NOTE [ Plan overheads ]: inner regions cost their calls
    return best, (least if least is not None else -1)


def solve_nested(graph: Graph, budget_bytes: int, solve_one: Callable[[Graph, int], Any], *,
                 selective: bool = True, solver: str | None = None, time_limit_s: float | None = None) -> Any:
    """The cheapest plan that fits among nested and one-level answers (NOTE [ Solving nested plans ]).

    Args:
        graph: the graph (a chunked plan's expanded graph, when called through ``solve_chunked``).
        budget_bytes: the whole step's budget.
        solve_one: the one-level solver, ``solve_one(graph, budget_bytes)`` (``solvers.solve`` of a
            registered name).
        selective: ``dp``'s option: its regions may keep nodes (NOTE [ The menu of kept sets ]); the
            frontier program's too.
        solver: the name of the one-level solver; ``"ilp"`` or ``"frontier"`` also runs the frontier
            program with ``nested=True`` (NOTE [ Solving nested plans ]).
        time_limit_s: the one-level solver's time limit, if any: the program's too, when under
            :data:`FRONTIER_TIME_LIMIT_S`.

    Raises:
        InfeasibleBudget: nothing fits; the least peak of what was tried (proven least when ``dp`` proved
            it on a chain, or the frontier program over the menu, and nothing tried went lower).
    """
    t0 = time.perf_counter()
    found: list[Any] = []
    failures: list[InfeasibleBudget] = []
    proven = None
    if solver in ("ilp", "frontier"):
        try:
            limit = FRONTIER_TIME_LIMIT_S if time_limit_s is None else min(FRONTIER_TIME_LIMIT_S, time_limit_s)
            proven = _by_nested_frontier(graph, budget_bytes, selective, limit)
        except InfeasibleBudget as exc:
            failures.append(exc)
        if proven is not None:
            found.append(proven)
    stops: list[CkptError] = []  # NOTE [ One deadline ]: a solve that stopped without a plan
    try:
        found.append(solve(graph, budget_bytes, solver="dp", nested=True, selective=selective))
    except InfeasibleBudget as exc:
        failures.append(exc)
    one_failed: InfeasibleBudget | None = None
    try:
        found.append(solve_one(graph, budget_bytes))
    except InfeasibleBudget as exc:
        one_failed = exc
    except CkptError as exc:
        if not stopped(exc):
            raise
        log.info("nested: the one-level solver stopped: %s", exc)
        stops.append(exc)
    if one_failed is not None:
        exc = one_failed
        failures.append(exc)
        if exc.best_regions:
            plan, least = nest_to_fit(graph, exc.best_regions, budget_bytes)
            if plan is not None:
                found.append(finalize(graph, dataclasses.replace(plan, status=Status.FEASIBLE), budget_bytes,
                                      "nested", {"nested": True, "from": exc.solver}, t0))
            elif least >= 0:
                failures.append(InfeasibleBudget(budget_bytes, least, solver="nested", best_regions=None,
                                                 scope=f"the nestings of {exc.solver or 'the solver'}'s least plan"))
    if found:
        # NOTE [ Plan overheads ]: nesting is chosen where it pays, its inner calls counted
        best = min(found, key=lambda p: (simulate(graph, p, record=False).total_cost, p.peak_bytes))
        status = best.status if best.solver == "dp" else Status.FEASIBLE
        if proven is not None and best.recompute_cost >= proven.recompute_cost:
            best, status = proven, Status.OPTIMAL  # optimal over the menu; what ties it is no cheaper
        elif proven is not None:
            log.warning("nested: %s found a plan cheaper (%d) than the frontier program's optimum over the menu "
                        "(%d): it lies outside the menu", best.solver, best.recompute_cost, proven.recompute_cost)
        if stops and status == Status.OPTIMAL and best is not proven:  # the one-level solver's answer is missing
            status = Status.FEASIBLE
        if best.status != status:
            best = dataclasses.replace(best, status=status, bound=None, gap=None)
        log.info("nested: %s, recompute %d", best.solver, best.recompute_cost)
        return dataclasses.replace(best, findings={**best.findings, "nested_regions": len(best.inner)})
    if stops and not any(e.solver == "frontier" and e.proven for e in failures):
        raise stops[0]
    exact = [e for e in failures if e.solver == "frontier" and e.proven]
    # the least floor of what was tried; the frontier program's is proven over the menu
    closest = exact[0] if exact else min(failures, key=lambda e: e.min_feasible_bytes)
    if closest.proven and closest.solver == "frontier":
        raise closest.replace(solver=solver or closest.solver)  # proven over the menu: named as the user asked
    if closest.proven and closest.solver == "dp" and not closest.scope:
        raise closest
    raise closest.replace(scope=closest.scope or "the plans nested solving tries (NOTE [ Solving nested plans ] "
                                                 "in solvers.model.nested)")


def _by_nested_frontier(graph: Graph, budget_bytes: int, selective: bool, time_limit_s: float) -> Any:
    """The frontier program with ``nested=True`` (NOTE [ Solving nested plans ]): a plan optimal over the
    menu, or None where the graph is too wide or the program stopped at its limits.

    Raises:
        InfeasibleBudget: no plan of the menu fits (its least peak, proven).
    """
    t0 = time.perf_counter()
    try:
        program = frontier_program(graph, blocks=False, selective=selective and keepable(graph), nested=True)
        plan = by_frontier(graph, budget_bytes, program, Deadline(time_limit_s),
                           max_work=int(FRONTIER_WORK_LIMIT * WORK_PER_S))
    except InfeasibleBudget as exc:
        raise InfeasibleBudget(budget_bytes, exc.min_feasible_bytes, solver="frontier",
                               best_regions=exc.best_regions, best_inner=exc.best_inner, best_saved=exc.best_saved,
                               scope="the plans nesting regions by the menu of inner regions "
                                     "(NOTE [ The menu of inner regions ] in solvers.model.nested)") from None
    except (TooWide, FrontierTimeout, SolverBug, MemoryError) as exc:
        log.info("nested: the frontier program gave no answer (%s)", exc or type(exc).__name__)
        return None
    over = "regions, kept nodes and the menu of inner regions" if program.kept is not None else \
        "regions and the menu of inner regions"
    return finalize(graph, dataclasses.replace(plan, findings=dict(plan.findings, optimal_over=over)),
                    budget_bytes, "frontier", {"nested": True, "selective": program.kept is not None}, t0)
