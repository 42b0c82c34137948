"""``ilp``: the optimal plan for any DAG.

Two exact methods search the same set of interval plans: the frontier
program (``solvers.frontier``, NOTE [ The frontier DP ]) solves graphs where
few tensors cross any position of the order in seconds; the CP-SAT model
below takes any DAG, with a time limit, a proven bound and a gap. ``auto``
tries the first and hands over to the second.

NOTE [ An exact model of simulate ]
    Decisions: ``x[k]`` (node ``k`` is in a region) and ``y[k]`` (a region
    starts at ``k``); ``cont[k] = x[k] and not y[k]`` (``k`` continues the
    region of ``k - 1``) and ``same(j, t)`` (``j`` and ``t`` lie in one
    region: ``x[j]`` and ``cont`` on ``(j, t]``). Every tensor's lifetime in
    ``simulate`` is a boolean function of these:

    * the forward copy of ``j`` is *held* (kept after its last forward
      consumer) when it saves itself outside a region, a stored consumer with
      requires_grad saves it, a region that does not contain ``j`` reads it,
      or nobody reads it (the caller holds it);
    * during the backward (and the recomputation) of node ``k``, holders at or
      before ``k`` still hold: stored savers ``c <= k``, regions reading ``j``
      that start at or before ``k`` (``x[c] and not same(j, c)`` for readers
      ``c <= k``, ``same(k, c) and not same(j, c)`` for readers ``c > k``);
    * a recomputed copy of ``j`` is alive at the recompute of ``k`` when ``j``
      is in ``k``'s region and a saver or a later reader of ``j`` is too
      (``same(j, min(first saver, first reader >= k))``), and at the backward
      of ``k`` when ``same(j, k)`` and a saver ``<= k`` exists;
    * own buffers, gradients and parameter gradients follow (the latter do not
      depend on the plan).

    One linear constraint per forward step, per recompute step (enforced when
    ``x[k]``) and per backward step bounds the live bytes by the budget;
    running sums (``S``, ``OW``, ``HB``, ``SX``) keep the model linear in size
    on graphs of narrow width. The objective is the recompute FLOPs; with
    ``minimise_peak`` it is the peak itself (the least feasible budget).
    Every answer is checked with ``simulate``; a plan the model got wrong
    would be cut off with a no-good and the model solved again (tests against
    brute force keep that loop from ever turning).

    On a graph with spans (NOTE [ Module-aligned regions ] in
    ``graphs.graph``) one more bool per usable span says it is a region, and
    ``x[k]``, ``y[k]``, ``cont[k]`` equal the sums of the chosen spans that
    hold ``k``, start at ``k``, and hold ``k`` past their first node: exact
    over the span-only plans. Both methods, the warm starts and the bounded
    heuristic search that set; the dp bound used as a cut is dp's optimum
    over it too. A span's ``extra_bytes`` (eager lifetimes in a recompute,
    NOTE [ Execution model ] in ``solvers.simulate``) add ``extra_bytes *
    z`` to the recompute-step constraint of each of its nodes.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from typing import Any

from graphs import Graph

from .deadline import Deadline
from .errors import InfeasibleBudget, SolverBug
from .frontier import MAX_WIDTH, FrontierDP, FrontierTimeout, TooWide
from .ilp_cpsat import (CP_SAT_OPTIONS, DEFAULT_WORK_LIMIT, WARM_SOLVERS, IlpSolver, IlpTimeout, Incumbent,
                        kept_solver, simple_peaks, warm_start as _warm_start)
from .options import Option
from .plan import Plan, Status
from .registry import register
from .simulate import simulate

__all__ = ["IlpTimeout", "ilp", "frontier", "solve_within", "IlpSolver", "Incumbent", "WARM_SOLVERS", "METHODS",
           "frontier_program"]

log = logging.getLogger(__name__)

#: ``ilp``'s methods: ``auto`` runs the frontier program on narrow graphs, CP-SAT otherwise.
METHODS = ("auto", "frontier", "cp-sat")
#: The share of the time limit ``auto`` keeps for CP-SAT when the frontier program runs first.
CP_SAT_SHARE = 0.2
#: The share of the time limit the bounded-width heuristic may take (wide graphs, no warm start).
HEURISTIC_SHARE = 0.1

_PROGRAMS: dict[tuple[int, int | None, bool, bool], tuple[Any, FrontierDP]] = {}


def frontier_program(graph: Graph, *, max_width: int | None = MAX_WIDTH, blocks: bool = True,
                     selective: bool = False) -> FrontierDP:
    """The frontier program of ``graph``, kept for the next call on the same graph object
    (a chain's block fronts do not depend on the budget: a sweep builds them once).

    Raises:
        TooWide: more than ``max_width`` tensors open at one position (decided in linear time).
    """
    key = (id(graph), max_width, blocks, selective)
    got = _PROGRAMS.get(key)
    if got is not None and got[0]() is graph:
        return got[1]
    program = FrontierDP(graph, max_width=max_width, blocks=blocks, selective=selective)
    if len(_PROGRAMS) >= 4:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = (weakref.ref(graph), program)
    return program


def _by_frontier(graph: Graph, budget_bytes: int, inc: Incumbent | None, deadline: Deadline, reserve_s: float,
                 required: bool, program: FrontierDP) -> Plan | None:
    """The optimum by the frontier program (NOTE [ The frontier DP ]), or None
    to hand the graph to CP-SAT (out of time, or a disagreement with
    ``simulate``, which is logged as the bug it would be). The program gets
    what the deadline leaves less ``reserve_s`` (kept for CP-SAT)."""
    limit = deadline.left() - reserve_s
    try:
        if limit <= 0:
            raise FrontierTimeout(f"no time left for the frontier program ({deadline.limit_s:g} s limit)")
        res = program.solve(budget_bytes, upper=inc.flops if inc is not None else None, time_limit_s=limit)
        if res is None and inc is None:
            # No interval plan fits: the least peak, by the same program, bounded by two plans' peaks.
            top = min(peak for peak, _ in simple_peaks(graph))
            least = program.solve(top, objective="peak", time_limit_s=max(1e-3, deadline.left() - reserve_s))
            if least is not None and least.objective > budget_bytes:
                raise InfeasibleBudget(budget_bytes, least.objective, solver="ilp", best_regions=least.regions)
            log.error("ilp frontier program found no plan under %d, yet its least peak is %s", budget_bytes,
                      None if least is None else least.objective)
            return None
    except FrontierTimeout as exc:
        if required:
            raise IlpTimeout(f"no plan found within {deadline.limit_s:g} s ({exc}); raise time_limit_s "
                             "(--time-limit), or use solver 'ilp' (CP-SAT takes over)") from None
        log.info("ilp: %s; solving with CP-SAT", exc)
        return None
    if res is None:
        log.error("ilp frontier program rejects the %s plan that simulate says fits", inc.source)
        return None
    sim = simulate(graph, Plan(regions=res.regions, saved=res.saved), record=False)
    if sim.peak_bytes > budget_bytes or sim.recompute_cost != res.objective:
        log.error("ilp frontier program predicted %d FLOPs under %d for %s keeping %s; simulate says %d FLOPs at %d",
                  res.objective, budget_bytes, res.regions, res.saved, sim.recompute_cost, sim.peak_bytes)
        return None
    regions, saved = (res.regions, res.saved) if inc is None or res.objective < inc.flops else (inc.regions, ())
    findings: dict[str, Any] = {"method": "frontier", "frontier_states": res.states}
    if res.blocks:
        findings["blocks_composed"] = res.blocks  # NOTE [ Composing repeated blocks ]
    return Plan(regions=regions, saved=saved, status=Status.OPTIMAL, bound=float(res.objective), findings=findings)


def _frontier_heuristic(graph: Graph, budget_bytes: int, time_limit_s: float) -> Incumbent | None:
    """A plan for a graph too wide for the exact program: the program with at
    most ``k`` unheld open tensors per boundary (the rest counted as held, so
    the plan fits), for ``k`` = 0, 2, 4, 8 while the time lasts; the cheapest."""
    deadline = Deadline(time_limit_s)
    program = FrontierDP(graph, max_width=None, blocks=False)
    best: Incumbent | None = None
    for k in (0, 2, 4, 8):
        if deadline.expired():
            break
        try:
            res = program.solve(budget_bytes, max_free=k, time_limit_s=deadline.left(),
                                upper=best.flops if best is not None else None)
        except FrontierTimeout as exc:
            log.info("ilp heuristic (max_free %d): %s", k, exc)
            break
        if res is None:
            log.info("ilp heuristic (max_free %d): no plan%s", k, " cheaper" if best is not None else "")
            continue
        sim = simulate(graph, Plan(regions=res.regions), record=False)
        if sim.peak_bytes <= budget_bytes and (best is None or sim.recompute_cost < best.flops):
            best = Incumbent(res.regions, int(sim.recompute_cost), f"frontier (max_free {k})")
    return best


def keepable(graph: Graph) -> bool:
    """Some node may be kept by a selective plan (saveable, of positive recompute cost)."""
    return any(s and c > 0 for s, c in zip(graph.saveable, graph.recompute_costs()))


def solve_within(graph: Graph, budget_bytes: int, deadline: Deadline, *, work_limit: float | None = DEFAULT_WORK_LIMIT,
                 workers: int = 2, seed: int = 0, warm_start: bool = True, gap_limit: float = 0.0,
                 method: str = "auto", blocks: bool = True, selective: bool = False) -> Plan:
    """``ilp`` against a given deadline (the solver's body, NOTE [ One deadline ]; tests pass a fake clock).

    Args and Returns: as :func:`ilp`.
    """
    if method not in METHODS:  # solve() checks it already; a direct call is checked here
        next(o for o in ILP_OPTIONS if o.name == "method").check(method, "ilp", ILP_OPTIONS)
    selective = selective and keepable(graph)  # nothing to keep: the plain search is the same search
    program = None
    if method != "cp-sat":
        try:
            program = frontier_program(graph, blocks=blocks, selective=selective)
        except TooWide as exc:
            if method == "frontier":
                raise TooWide(exc.width, exc.max_width, exc.position, prefix="ilp method 'frontier' needs a narrow "
                              "graph: ", advice="use method 'auto' or 'cp-sat'") from None
            log.info("ilp: %s; solving with CP-SAT", exc)
    # The frontier program is exact when it finishes; CP-SAT keeps a fifth of the time (or what a
    # projected overrun leaves: the program gives up early when it would not finish).
    reserve = 0.0 if method == "frontier" else CP_SAT_SHARE * deadline.limit_s
    if program is not None and program.chain is not None:
        plan = _by_frontier(graph, budget_bytes, None, deadline, reserve, method == "frontier", program)
        if plan is not None:
            return plan
    if selective:  # NOTE [ Kept nodes in the CP-SAT model ]; None: too many choices for it
        plan = kept_solver()(graph, budget_bytes, deadline, work_limit=work_limit, workers=workers, seed=seed,
                             gap_limit=gap_limit, warm_start_=warm_start)
        if plan is not None:
            return plan
    tried: list[str] | None = [] if warm_start else None  # the fast solvers that found nothing: never advised
    inc, bound = _warm_start(graph, budget_bytes, deadline, tried) if warm_start else (None, None)
    if selective:
        bound = None  # dp's bound is over plans without kept nodes
    if inc is not None and (inc.flops == 0 or (bound is not None and inc.flops <= bound)):
        return Plan(regions=inc.regions, status=Status.OPTIMAL, bound=float(inc.flops),
                    findings={"method": "warm start", "incumbent": inc.source})
    if program is not None and program.chain is None:
        plan = _by_frontier(graph, budget_bytes, inc, deadline, reserve, method == "frontier", program)
        if plan is not None:
            return plan
    if method == "auto" and warm_start and inc is None and not deadline.expired():
        # Too wide (or slow) to be exact, and no fast solver found a plan: CP-SAT would start from
        # nothing. The program's bounded-width form gives it one, in a tenth of the time limit (run
        # also where a fast plan existed, that time served CP-SAT better: 60 s random DAGs).
        inc = _frontier_heuristic(graph, budget_bytes, min(HEURISTIC_SHARE * deadline.limit_s, deadline.left()))
        if inc is not None:
            log.info("ilp warm start: %s, %d FLOPs", inc.source, inc.flops)
    try:
        plan = IlpSolver(graph, budget_bytes, deadline=deadline, work_limit=work_limit, workers=workers, seed=seed,
                         gap_limit=gap_limit, lower_bound=bound, incumbent=inc, tried=tried).solve()
    except InfeasibleBudget as exc:
        if selective:  # a plan keeping nodes might still fit: dp's, else the least over plans keeping none
            kept = _dp_selective(graph, budget_bytes, None)
            if kept is not None:
                return kept
            raise exc.replace(time_limit_s=deadline.limit_s, scope="the plans that keep no node (the frontier "
                              "program could not run; CP-SAT's kept-node model was too large)") from None
        if exc.proven:
            raise
        raise exc.replace(time_limit_s=deadline.limit_s) from None  # the limit the caller gave
    return _without_kept_nodes(graph, budget_bytes, plan) if selective else plan


_NOT_SEARCHED = ("not searched: the graph was too wide or slow for the frontier program, and has too many (region, "
                 "menu entry) choices for CP-SAT's kept-node model")


def _without_kept_nodes(graph: Graph, budget_bytes: int, plan: Plan) -> Plan:
    """A CP-SAT plan where ``selective`` was asked: it fits, but its optimality and bound hold only over
    plans that keep no node (the program could not run), and ``findings`` say so; ``dp``'s selective
    plan instead where it fits and costs less."""
    log.warning("ilp: selective recompute asked, but the frontier program could not run; the plan is not proven "
                "optimal over selective plans")
    cost = simulate(graph, plan, record=False).recompute_cost
    kept = _dp_selective(graph, budget_bytes, cost)
    if kept is not None:
        return kept
    findings = dict(plan.findings, selective=_NOT_SEARCHED)
    return dataclasses.replace(plan, status=Status.FEASIBLE, bound=None, gap=None, findings=findings)


def _dp_selective(graph: Graph, budget_bytes: int, below: int | None) -> Plan | None:
    """``dp``'s plan with kept nodes when it fits and costs less than ``below`` (None: any cost), as ``feasible``."""
    from .dp import dp

    try:
        plan = dp(graph, budget_bytes)
    except InfeasibleBudget:
        return None
    sim = simulate(graph, plan, record=False)
    if not plan.saved or sim.peak_bytes > budget_bytes or (below is not None and sim.recompute_cost >= below):
        return None
    return Plan(regions=plan.regions, saved=plan.saved, status=Status.FEASIBLE,
                findings={"method": "warm start", "incumbent": "dp (selective)", "selective": _NOT_SEARCHED})


ILP_OPTIONS = CP_SAT_OPTIONS + (
    Option("method", str, "auto (the frontier program where the graph is narrow, then CP-SAT), frontier or cp-sat",
           choices=METHODS),
    Option("blocks", bool, "let the frontier program compose repeated blocks (False: walk every node; same optimum)"),
    Option("selective", bool, "regions may keep op outputs (NOTE [ The menu of kept sets ]): exact by the frontier "
           "program, else by CP-SAT with kept nodes; past that model's size limit the plan keeps none (feasible)"),
)


@register("ilp", options=ILP_OPTIONS, exact=True)
def ilp(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0, work_limit: float | None = DEFAULT_WORK_LIMIT,
        workers: int = 2, seed: int = 0, gap_limit: float = 0.0, warm_start: bool = True, method: str = "auto",
        blocks: bool = True, selective: bool = False) -> Plan:
    """Least-recompute interval plan under ``budget_bytes``, proven optimal.

    Two exact methods over the same set of plans: the frontier program
    (NOTE [ The frontier DP ]), fast when few tensors cross any position of
    the order (transformers, chains, narrow DAGs), and the CP-SAT model
    (NOTE [ An exact model of simulate ]) for any DAG, with a bound and a
    gap. On a chain of repeated blocks (a traced LLM) the program crosses
    each block by the block's own Pareto front (NOTE [ Composing repeated
    blocks ]). The same graph and budget give the same plan on a busy
    machine: CP-SAT stops at a deterministic work limit, and
    ``time_limit_s`` is only a safety net (NOTE [ Deterministic CP-SAT ]
    in ``solvers.ilp_cpsat``); OR-Tools is imported only when CP-SAT runs.

    Args:
        time_limit_s: wall clock: the call returns within this + 0.5 s with
            the best plan and its gap (NOTE [ One deadline ]).
        work_limit: CP-SAT's deterministic work limit (``max_deterministic_time``,
            about seconds of one idle core); None: the wall clock only (faster
            parallel search, answers that depend on the load).
        workers: CP-SAT search workers.
        seed: CP-SAT's random seed.
        gap_limit: stop as soon as the relative gap is at most this (e.g.
            0.01); the plan is then ``feasible`` with its bound. 0: run until
            optimality is proven or a limit.
        warm_start: start from the cheapest fitting plan of ``dp``, ``chen``,
            ``uniform`` and ``per-module``: it hints the search, caps the
            objective and is returned if CP-SAT finds nothing cheaper, so
            ``ilp`` is never worse than any of them and never fails where one
            found a plan. Where the program composes repeated blocks it runs
            first, with no warm start: it is exact, and faster than the warm
            starts (``uniform`` alone simulates 2,044 plans on a Llama op graph).
        method: ``auto`` (the frontier program on graphs at most
            ``frontier.MAX_WIDTH`` wide, given what the deadline leaves less
            a fifth of the limit, then CP-SAT if it did not finish),
            ``frontier`` or ``cp-sat``.
        blocks: let the frontier program compose repeated blocks (False:
            walk every node; the same optimum, for comparisons).
        selective: regions may also keep nodes (selective recompute, NOTE
            [ The menu of kept sets ] in ``solvers.selective``): the frontier
            program is then exact over ``(region, menu entry)`` pairs (NOTE
            [ Kept nodes in the frontier DP ]; it walks every node: blocks are
            not composed). Where it cannot run (too wide, out of time, or
            ``method="cp-sat"``) CP-SAT with kept nodes is exact over them too
            (NOTE [ Kept nodes in the CP-SAT model ] in ``solvers.ilp_kept``);
            past that model's size limit the answer is the cheaper of CP-SAT's
            plan (no kept nodes) and ``dp``'s selective plan, ``feasible``
            with no bound and a ``findings["selective"]`` saying so.
            False (the default): regions only.

    Returns:
        ``optimal``, or ``feasible`` with ``bound`` (and so ``gap``) set;
        ``findings`` name the method that answered and the work it did.

    Raises:
        InfeasibleBudget: carrying the least peak of any interval plan.
        IlpTimeout: no plan within the time limit (none of the warm-start
            solvers found one either).
        TooWide: ``method="frontier"`` on a graph too wide for the program.
        MissingDependency: CP-SAT must run and OR-Tools is not installed.
    """
    return solve_within(graph, budget_bytes, Deadline(time_limit_s), work_limit=work_limit, workers=workers, seed=seed,
                        warm_start=warm_start, gap_limit=gap_limit, method=method, blocks=blocks, selective=selective)


@register("frontier", options=(
    Option("time_limit_s", float, "wall-clock limit on the program (NOTE [ One deadline ])", minimum=0),
    Option("max_width", int, "refuse graphs with more tensors open at one position (the states grow as 2**width)",
           minimum=0),
    Option("blocks", bool, "compose repeated blocks by their own fronts (False: walk every node; same optimum)"),
    Option("selective", bool, "regions may keep op outputs (NOTE [ Kept nodes in the frontier DP ]): exact over "
           "(region, menu entry) pairs; blocks are then walked node by node"),
), exact=True, part_of="ilp")
def frontier(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0, max_width: int = MAX_WIDTH,
             blocks: bool = True, selective: bool = False) -> Plan:
    """The exact frontier program alone (NOTE [ The frontier DP ]): graphs where few tensors cross any position.

    No warm start and no OR-Tools; deterministic when it finishes in time.
    With ``selective`` its regions may keep nodes (the plan's ``saved``),
    optimal over ``(region, menu entry)`` pairs.

    Returns:
        An ``optimal`` plan; ``findings`` carry the states explored and the blocks composed.

    Raises:
        TooWide: more than ``max_width`` tensors open at one position: use
            solver ``ilp`` (it hands such graphs to CP-SAT) or ``cp-sat``.
        InfeasibleBudget: carrying the least peak of any interval plan.
        IlpTimeout: the program did not finish within ``time_limit_s``.
    """
    program = frontier_program(graph, max_width=max_width, blocks=blocks, selective=selective and keepable(graph))
    plan = _by_frontier(graph, budget_bytes, None, Deadline(time_limit_s), 0.0, True, program)
    if plan is None:  # a disagreement with simulate, already logged as the bug it is
        raise SolverBug("the frontier program's answer disagrees with simulate (see the log); please report this "
                        "graph, and use solver 'cp-sat' meanwhile")
    return plan
