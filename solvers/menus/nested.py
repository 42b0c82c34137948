"""Nested regions: a region whose recompute runs with inner regions checkpointed.

NOTE [ Nested regions ]
    A plan may nest regions one level deep (depth 2): ``Plan.inner`` lists
    regions that lie strictly inside one of ``Plan.regions`` (its *outer*
    region). Applied, the outer call runs under a non-reentrant checkpoint and
    the inner calls, which it makes, under checkpoints of their own
    (``torch.utils.checkpoint`` nests; Chen et al.'s recursive schedule, the
    revolve / Rotor family). ``simulate`` walks it as torch runs it
    (``_NestedWalk``); every other step is NOTE [ Execution model ]:

    * forward: the outer region is a region like any other (it keeps its
      inputs only). The inner checkpoints save their inputs through the
      outer's pack hook, so they keep nothing either; a stochastic inner
      region stores its generator state (NOTE [ RNG state per region ]) from
      its first forward step to the backward of its first node;
    * when the backward reaches the outer's last node, its recompute runs the
      outer's nodes from its inputs; a node outside every inner region keeps
      what it saves (as in a one-level recompute), a node inside an inner
      region keeps nothing (own buffers freed at once, its output freed after
      its last consumer), and each inner region's inputs made by the
      recompute are kept (the outer's recompute stores what the inner
      checkpoint saves) until that inner region's own recompute ends; so is
      the generator state a stochastic inner region's checkpoint stores again
      as the recompute runs it (its own recompute replays from that copy;
      released at the end of the outer's recompute before, a step measured
      4,800 bytes over its prediction: ``tests/regressions/test_nested_inner_rng.py``);
    * early stop: the outer's recompute ends as soon as it has saved again
      the last tensor the outer saved (non-reentrant checkpoint's early
      stop). An inner region saves its inputs before it runs, so when no node
      of the outer after its last inner region saves anything, the recompute
      stops at that inner region's first node: it runs only the nodes before,
      keeps that inner region's inputs, and the inner region is recomputed
      once (in its own recompute), not twice. Otherwise the whole outer
      region runs, as a one-level recompute does;
    * when the backward reaches an inner region's last node, the inner region
      is recomputed as a one-level region (NOTE [ Execution model ]) from the
      inputs the outer's recompute kept. torch hands them over as the inner
      checkpoint unpacks them (the outer's copy is cleared then), and the
      inner recompute saves again whatever of them its nodes save: such an
      input stays until the backward of the last inner node that saves it (a
      linear layer's or a norm's input, the residual stream); the others are
      released when the inner recompute ends. (Until issue 33 the walk
      released every one of them there: plans measured up to 9 % over their
      prediction; ``tests/scheduler/applying/test_nested_truth.py`` holds
      the walk to the allocator on real modules.)
    * recompute cost: every node the outer's recompute runs, plus every node
      of every inner region once more.

    Outer regions with inner regions keep no nodes (``Plan.saved``; refused
    by ``Plan``), and a plan without inner regions runs exactly the one-level
    walk. What an outer region's eager forward holds (``extra_bytes``) is
    held through its recompute as for a one-level region; an inner region's
    through its own recompute.

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

NOTE [ The menu of inner regions ]
    The exact solvers optimise over a restricted, stated space: a region
    ``first..last`` (a module call: a span) is either one level, or nested
    with *all of its child calls* as inner regions, where the child calls are
    the maximal spans strictly inside it that are single calls (no
    ``nn.Sequential`` run: its parent's ``forward`` could not carry both,
    and no chunk of a chunked call), taken greedily left to right while
    disjoint (:func:`inner_menu`). "Outer run of calls, inner calls": a
    block with its attention and MLP inside, a stage with its blocks. So a
    nested plan is a one-level plan with a flag per region, and ``dp``
    (``nested=True``) and the brute force (``nested=True``) are exact over
    those pairs. A graph without spans has no child calls: nothing nests.
    The brute force also enumerates the whole depth-2 space
    (``pareto_frontier(graph, nested="every")``: every set of disjoint spans
    inside each region): on 25 random chains of at most 8 nodes the menu
    reached its least budget on all 25 (``tests/solvers/test_nested.py``; on
    22 before issue 33, when the walk freed the inputs inner nodes save and
    nesting looked cheaper than it runs).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any, Callable, Sequence

from graphs import CkptError, Graph

from .chunks import parse_chunk_module
from .deadline import stopped
from .errors import InfeasibleBudget
from .model.plan import Plan, Status
from .registry import finalize, solve
from .model.simulate import simulate

__all__ = ["inner_menu", "nested_plan_inner", "nest_to_fit", "solve_nested", "MAX_FLAG_REGIONS",
           "FRONTIER_TIME_LIMIT_S", "FRONTIER_WORK_LIMIT"]

log = logging.getLogger(__name__)

#: :func:`nest_to_fit` tries every choice of nested regions up to this many regions with child calls.
MAX_FLAG_REGIONS = 10
#: :func:`solve_nested`'s frontier program (NOTE [ Solving nested plans ]): its wall-clock limit, and its work
#: limit in about seconds of one idle core (NOTE [ The frontier program's work ]).
FRONTIER_TIME_LIMIT_S = 60.0
FRONTIER_WORK_LIMIT = 30.0


def _is_call(path: str) -> bool:
    """A single module call an inner region may be (not a Sequential run, nor a chunk of a chunked call)."""
    return bool(path) and "[" not in path and parse_chunk_module(path) is None and "+loss" not in path


def inner_menu(graph: Graph, a: int, b: int) -> tuple[tuple[int, int], ...]:
    """The child calls of region ``a..b`` (NOTE [ The menu of inner regions ]): ``()`` when none.

    Args:
        graph: a graph with spans (the expanded graph of a chunked plan, if any).
        a, b: the outer region, inclusive.
    """
    cache = graph.cached("_inner_menus", dict)
    key = (a, b)
    if key in cache:
        return cache[key]
    if not graph.spans:
        cache[key] = ()
        return ()
    inside = sorted({(sp.first, sp.last) for sp in graph.spans
                     if a <= sp.first and sp.last <= b and (sp.first, sp.last) != (a, b) and _is_call(sp.module)},
                    key=lambda r: (r[0], -r[1]))
    names = {}
    for sp in graph.spans:
        names.setdefault((sp.first, sp.last), []).append(sp.module)
    out: list[tuple[int, int]] = []
    end = a - 1
    for x, y in inside:
        if x > end:  # maximal: not inside the one taken before; disjoint from it
            if all(_is_call(m) for m in names[(x, y)]) and graph.span_module((x, y)) != graph.span_module((a, b)):
                out.append((x, y))
                end = y
    result = tuple(out)
    cache[key] = result
    return result


def nested_plan_inner(graph: Graph, regions: Sequence[tuple[int, int]],
                      flags: Sequence[bool]) -> tuple[tuple[int, int], ...]:
    """``Plan.inner`` for ``regions`` where ``flags`` says which are nested (each with its :func:`inner_menu`)."""
    out: list[tuple[int, int]] = []
    for (a, b), nest in zip(regions, flags):
        if nest:
            out.extend(inner_menu(graph, a, b))
    return tuple(out)


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
        if sim.peak_bytes <= budget_bytes and (best_cost is None or sim.recompute_cost < best_cost):
            best, best_cost = plan, sim.recompute_cost
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
        best = min(found, key=lambda p: (p.recompute_cost, p.peak_bytes))
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
                                                 "in solvers.nested)")


def _by_nested_frontier(graph: Graph, budget_bytes: int, selective: bool, time_limit_s: float) -> Any:
    """The frontier program with ``nested=True`` (NOTE [ Solving nested plans ]): a plan optimal over the
    menu, or None where the graph is too wide or the program stopped at its limits.

    Raises:
        InfeasibleBudget: no plan of the menu fits (its least peak, proven).
    """
    from .deadline import Deadline
    from .errors import SolverBug
    from .frontier.front import TooWide
    from .frontier.phases import by_frontier, frontier_program, keepable
    from .frontier.program import WORK_PER_S, FrontierTimeout

    t0 = time.perf_counter()
    try:
        program = frontier_program(graph, blocks=False, selective=selective and keepable(graph), nested=True)
        plan = by_frontier(graph, budget_bytes, program, Deadline(time_limit_s),
                           max_work=int(FRONTIER_WORK_LIMIT * WORK_PER_S))
    except InfeasibleBudget as exc:
        raise InfeasibleBudget(budget_bytes, exc.min_feasible_bytes, solver="frontier",
                               best_regions=exc.best_regions, best_inner=exc.best_inner, best_saved=exc.best_saved,
                               scope="the plans nesting regions by the menu of inner regions "
                                     "(NOTE [ The menu of inner regions ] in solvers.nested)") from None
    except (TooWide, FrontierTimeout, SolverBug, MemoryError) as exc:
        log.info("nested: the frontier program gave no answer (%s)", exc or type(exc).__name__)
        return None
    over = "regions, kept nodes and the menu of inner regions" if program.kept is not None else \
        "regions and the menu of inner regions"
    return finalize(graph, dataclasses.replace(plan, findings=dict(plan.findings, optimal_over=over)),
                    budget_bytes, "frontier", {"nested": True, "selective": program.kept is not None}, t0)
