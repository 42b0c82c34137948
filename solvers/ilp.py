"""``ilp``: the optimal plan for any DAG.

Two exact methods search the same set of plans: the frontier program
(``solvers.frontier.program``, NOTE [ The frontier DP ]) solves graphs where few
tensors cross any position of the order in seconds; the CP-SAT model below
takes any DAG, with a time limit, a proven bound and a gap. ``auto`` tries
the first and hands over to the second (NOTE [ One plan space ]).

NOTE [ One plan space ]
    ``ilp`` (the default of ``scheduler.solve``, ``ckpt solve``, ``fit`` and
    ``compare``), its methods ``frontier`` and ``cp-sat``, and ``dp`` search
    one set of plans by default: regions, each keeping one entry of its menu
    of kept nodes (``selective=True``, NOTE [ The menu of kept sets ] in
    ``solvers.model.selective``). A plan that keeps no node is in that set, so the
    default never answers worse than ``selective=False``. ``ilp`` runs what
    the graph allows, in this order:

    1. the frontier program without kept nodes (repeated blocks composed),
       where the graph is narrow: the optimum over the plans that keep no
       node, fast (0.04 s on a Llama-2-7B op graph);
    2. the frontier program with kept nodes, pruned by that optimum: the
       optimum over the whole set;
    3. only where the program cannot run (too wide) or did not finish within
       its work: the warm starts and CP-SAT, with kept nodes up to the size
       of its kept-node model (NOTE [ Kept nodes in the CP-SAT model ]).

    Where a few passes over the graph (timed at the start) are more than
    :data:`EARLY_SHARE` of the limit, the warm starts before ``dp``
    (store-all, ``per-module``, Chen's ``sqrt(n)`` plan) run before 1, so a
    program stopped by the clock still leaves a plan (a 20,000-node chain at
    5 s once had none idle and Chen's plan busy, a 100,000-node chain none
    at 60 s on a loaded machine).
    ``method="frontier"`` runs 1 and 2 only, ``method="cp-sat"`` 3 only. A
    plan says over which set it is proven optimal: ``findings["optimal_over"]``
    is "regions and kept nodes" (status ``optimal``), or "regions only" when
    the kept-node search did not finish (status ``feasible``: a plan keeping
    nodes might cost less; ``findings["selective"]`` says why), and is left
    out when neither is proven (``feasible``, CP-SAT's bound where it has one).
    With ``selective=False`` the set is the plans that keep no node, and an
    ``optimal`` plan says "regions only". Kept nodes once were off in ``ilp``
    and on in ``dp`` and ``compare``: ``ckpt solve`` wrote ``ilp``'s plan,
    labelled optimal, at 22.1 % recompute where ``dp`` found 11.1 %.

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
    NOTE [ Execution model ] in ``solvers.model.simulate``) add ``extra_bytes *
    z`` to the recompute-step constraint of each of its nodes.
"""

from __future__ import annotations


import dataclasses
import logging
from typing import Any

from graphs import Graph

from .deadline import PASS_S_PER_NODE, Deadline
from .errors import InfeasibleBudget, SolverBug
from .frontier.program import MAX_WIDTH, WORK_PER_S, FrontierTimeout, TooWide
from .cpsat.solver import (CP_SAT_OPTIONS, DEFAULT_WORK_LIMIT, WARM_SOLVERS, IlpSolver, IlpTimeout, Incumbent,
                           checkpoint_model, cp_sat_may_start, solve_within as cp_sat_within)
from .frontier.phases import by_frontier, frontier_program, heuristic_start, keepable
from .options import Option
from .model.plan import Plan, Status
from .registry import register
from .model.overheads import graph_overheads
from .model.simulate import simulate
from .warm import Warm, warm_starts

__all__ = ["IlpTimeout", "ilp", "frontier", "cp_sat", "solve_within", "IlpSolver", "Incumbent", "WARM_SOLVERS", "METHODS",
           "frontier_program", "keepable", "KEPT", "REGIONS"]

log = logging.getLogger(__name__)

#: ``ilp``'s methods: ``auto`` runs the frontier program on narrow graphs, CP-SAT otherwise.
METHODS = ("auto", "frontier", "cp-sat")
#: The share of the time limit ``auto`` keeps for the warm starts and CP-SAT when the frontier program runs first.
CP_SAT_SHARE = 0.2
#: What the graph's fingerprint costs in passes over it (a JSON dump: about two simulations), and the passes
#: before any plan is checked: the fingerprint and one plan's simulation.
FINGERPRINT_PASSES = 2.0
FIRST_PASSES = FINGERPRINT_PASSES + 1
#: Where those passes take more than this share of the limit, the first warm starts run before the program.
EARLY_SHARE = 0.02
#: ``findings["optimal_over"]``: the sets of plans (NOTE [ One plan space ]).
KEPT = "regions and kept nodes"
REGIONS = "regions only"


def _proven(plan: Plan, over: str) -> Plan:
    """``plan``, optimal over ``over``, saying so."""
    return dataclasses.replace(plan, findings=dict(plan.findings, optimal_over=over))


def _regions_only(plan: Plan, why: str, bound: float | None = None) -> Plan:
    """A plan searched without kept nodes where kept nodes were asked for and not all searched:
    ``feasible``, with ``bound`` (a lower bound over the whole set, if any), ``optimal_over`` "regions only"
    when it is optimal over those (NOTE [ One plan space ])."""
    log.warning("ilp: kept nodes not fully searched (%s); the plan is proven at best over the plans that keep "
                "no node", why)
    findings = dict(plan.findings, selective=f"not searched: {why}")
    if plan.status == Status.OPTIMAL:
        findings["optimal_over"] = REGIONS
    return dataclasses.replace(plan, status=Status.FEASIBLE, bound=bound, gap=None, findings=findings)


def _warm_plan(inc: Incumbent, status: str = Status.FEASIBLE, **findings: str) -> Plan:
    """A warm start's plan as the answer."""
    return Plan(regions=inc.regions, saved=inc.saved, status=status,
                bound=float(inc.flops) if status == Status.OPTIMAL else None,
                findings={"method": "warm start", "incumbent": inc.source, **findings})


def _stopped(exc: BaseException, what: str) -> str:
    if isinstance(exc, MemoryError):  # never raw: the next phase takes over (issue 24: dp at 100,000 nodes)
        return f"{what} ran out of memory"
    by = getattr(exc, "by", None)
    return f"{what} stopped at its {by}" if by else f"{what} failed ({exc})"


def solve_within(graph: Graph, budget_bytes: int, deadline: Deadline, *, work_limit: float | None = DEFAULT_WORK_LIMIT,
                 workers: int = 2, seed: int = 0, warm_start: bool = True, gap_limit: float = 0.0,
                 method: str = "auto", blocks: bool = True, selective: bool = True,
                 max_width: int | None = MAX_WIDTH) -> Plan:
    """``ilp`` against a given deadline (the solver's body, NOTE [ One deadline ]; tests pass a fake clock).

    Args and Returns: as :func:`ilp`; ``max_width`` as for :func:`frontier`.
    """
    if method not in METHODS:  # solve() checks it already; a direct call is checked here
        next(o for o in ILP_OPTIONS if o.name == "method").check(method, "ilp", ILP_OPTIONS)
    n = len(graph)
    if PASS_S_PER_NODE * n * FIRST_PASSES > 0.1 * deadline.left():  # passes: a large part of what is left
        deadline.probe_load()  # (of what is left: a command that spent its limit reading the graph, NOTE [ One deadline ])
    if deadline.left() < FIRST_PASSES * deadline.pass_estimate(n) + deadline.read_out_s(n):
        raise IlpTimeout(f"no plan found within {deadline.limit_s:g} s: one pass over this graph's {n} nodes takes "
                         f"about {deadline.pass_estimate(n):.2g} s here, and finding and checking a plan about "
                         f"{FIRST_PASSES + 1:g} passes; raise time_limit_s (--time-limit)")
    t0 = deadline.clock()
    graph.fingerprint()  # the read-out needs it: one pass over the graph (0.8 s at 100,000 nodes), within the limit
    if deadline.clock() - t0 > 0.01:
        deadline.pass_s = (deadline.clock() - t0) / FINGERPRINT_PASSES  # timed here and now (NOTE [ One deadline ])
    kept = selective and keepable(graph)  # nothing to keep: the plain search is the whole search
    over = KEPT if selective else REGIONS
    max_work = None if work_limit is None else int(work_limit * WORK_PER_S)
    plain: Plan | None = None  # the optimum over the plans keeping no node, once proven
    infeasible: InfeasibleBudget | None = None  # no plan keeping no node fits (proven)
    why = "method 'cp-sat'" if method == "cp-sat" else "the frontier program could not run"
    early: Warm | None = None
    if method == "auto" and warm_start and FIRST_PASSES * deadline.pass_estimate(n) > EARLY_SHARE * deadline.limit_s:
        ahead = deadline.before(deadline.read_out_s(n))  # a plan in hand before the program (NOTE [ One plan space ])
        early = warm_starts(graph, budget_bytes, ahead, first=True)
        deadline.pass_s = ahead.pass_s  # timed again on each plan simulated
    if method != "cp-sat":
        try:
            program = frontier_program(graph, max_width=max_width, blocks=blocks)
        except TooWide as exc:
            if method == "frontier":
                raise TooWide(exc.width, exc.max_width, exc.position, prefix="ilp method 'frontier' needs a narrow "
                              "graph: ", advice="use method 'auto' or 'cp-sat'") from None
            log.info("ilp: %s; solving with CP-SAT", exc)
            program = None
            why = f"the graph is too wide for the frontier program ({exc.width} open tensors)"
        # The program is exact when it finishes; auto keeps a share of the time for what follows, at least
        # what a few warm-start plans and the read-out take (a simulation each: 0.65 s at 100,000 nodes).
        keep = max(CP_SAT_SHARE * deadline.limit_s, deadline.read_out_s(n) + 2 * deadline.pass_estimate(n))
        sub = deadline if method == "frontier" else deadline.before(keep)
        if program is not None and method == "auto" and sub.left() < deadline.pass_estimate(n):
            program, why = None, "no time left for the frontier program"  # what is left goes to a plan
        if program is not None:
            try:
                plain = by_frontier(graph, budget_bytes, program, sub, max_work=max_work)
            except InfeasibleBudget as exc:
                if not kept:
                    raise
                infeasible = exc  # keeping nodes may lower the peak
            except (FrontierTimeout, SolverBug, MemoryError) as exc:
                if method == "frontier" and isinstance(exc, SolverBug):
                    raise
                why = _stopped(exc, "the frontier program")
                log.info("ilp: %s", why)
            if plain is not None and (not kept or plain.bound == 0):
                return _proven(plain, over)  # recomputing nothing is optimal over any set
            if plain is not None or infeasible is not None:  # kept nodes: the program with them, pruned
                left = None if max_work is None else max(0, max_work - program.work)
                try:
                    with_kept = frontier_program(graph, max_width=max_width, blocks=blocks, selective=True)
                    upper = None if plain is None else int(plain.bound) + plain.findings.get("objective_calls", 0)
                    return _proven(_less_total(graph, plain, by_frontier(graph, budget_bytes, with_kept, sub,
                                                                         max_work=left, upper=upper)), KEPT)
                except (FrontierTimeout, SolverBug, MemoryError) as exc:
                    if method == "frontier" and isinstance(exc, SolverBug):
                        raise
                    why = _stopped(exc, "the frontier program with kept nodes")
                    log.info("ilp: %s", why)
        if method == "frontier":
            if plain is not None:
                return _regions_only(plain, why)
            if infeasible is not None:
                raise infeasible.replace(scope=f"the plans that keep no node ({why})") from None
            raise IlpTimeout(f"no plan found within {deadline.limit_s:g} s ({why}); raise time_limit_s "
                             "(--time-limit) or work_limit, or use method 'auto' (CP-SAT takes over)")
    if plain is not None or infeasible is not None:
        return _kept_after_program(graph, budget_bytes, deadline, plain, infeasible, why, work_limit, workers, seed,
                                   gap_limit)
    return _by_cp_sat(graph, budget_bytes, deadline, work_limit=work_limit, workers=workers, seed=seed,
                      warm_start=warm_start, gap_limit=gap_limit, kept=kept, over=over, heuristic=method == "auto",
                      max_work=max_work, why=why, early=early)


def _less_total(graph: Graph, plain: Plan | None, kept: Plan) -> Plan:
    """Of the optimum keeping no node and the optimum keeping nodes, the one of less total cost: a kept call's
    bookkeeping (NOTE [ Plan overheads ]) is not in the program's objective, so a plan keeping nodes may save
    less recompute than its dispatch modes cost (Llama at its peak: 0.3 ms saved, 3.4 ms of bookkeeping)."""
    if plain is None or not kept.saved or graph_overheads(graph) is None:
        return kept
    a, b = simulate(graph, plain, record=False), simulate(graph, kept, record=False)
    if a.total_cost > b.total_cost:
        return kept
    log.info("ilp: the plan keeping no node is cheaper in total (%d) than the one keeping %d (%d)", a.total_cost,
             len(kept.saved), b.total_cost)
    return dataclasses.replace(plain, findings=dict(plain.findings, chosen_on="total cost: recompute, region calls "
                                                    "and the kept calls' bookkeeping"))


def _kept_after_program(graph: Graph, budget_bytes: int, deadline: Deadline, plain: Plan | None,
                        infeasible: InfeasibleBudget | None, why: str, work_limit: float | None, workers: int,
                        seed: int, gap_limit: float) -> Plan:
    """The program proved the optimum without kept nodes (``plain``: the answer, ``feasible``, saying so) or
    that none fits (``infeasible``), but did not finish with kept nodes. Where none fits, CP-SAT with kept
    nodes, where its model takes the graph and there is time for it, may still find one. (After a proven
    optimum it is not run: on the graphs the program stops on, its model proves nothing in what is left,
    and importing OR-Tools and building it took 2 s of a 1 s limit on a Llama-2-7B op graph.)"""
    if plain is not None:
        return _regions_only(plain, why)
    assert infeasible is not None
    if cp_sat_may_start(deadline, len(graph)):
        got = kept_solver()(graph, budget_bytes, deadline, work_limit=work_limit, workers=workers, seed=seed,
                            gap_limit=gap_limit, warm_start_=False)
        if got is not None:
            return _proven(got, KEPT) if got.status == Status.OPTIMAL else dataclasses.replace(
                got, findings=dict(got.findings, selective=f"not searched: {why}"))
        why = f"{why}; too many (region, menu entry) choices for CP-SAT's kept-node model"
    raise infeasible.replace(scope=f"the plans that keep no node ({why})") from None


def _by_cp_sat(graph: Graph, budget_bytes: int, deadline: Deadline, *, work_limit: float | None, workers: int,
               seed: int, warm_start: bool, gap_limit: float, kept: bool, over: str, heuristic: bool,
               max_work: int | None, why: str, early: Warm | None = None) -> Plan:
    """The warm starts and CP-SAT (with kept nodes up to its model's size): the graph is too wide for the
    frontier program, it did not finish, or ``method="cp-sat"``. ``early``: the first warm starts, run
    before the program."""
    # The warm starts leave the read-out its time (a simulation each, checked before it starts).
    warm = warm_starts(graph, budget_bytes, deadline.before(deadline.read_out_s(len(graph))), work_limit=work_limit,
                       selective=kept, limit_s=deadline.limit_s, resume=early) if warm_start else Warm()
    best = warm.best
    if best is not None and (best.flops == 0 or (warm.bound is not None and best.flops <= warm.bound)):
        return _proven(_warm_plan(best, Status.OPTIMAL), over)  # dp's bound is over the plans asked for
    # Too wide (or slow) to be exact, and no fast solver found a plan: CP-SAT would start from nothing. The
    # program's bounded-width form gives it one, once (NOTE [ The heuristic's first pass ] in solvers/frontier/phases.py)
    start = heuristic and warm_start and warm.plain is None and not deadline.expired()
    heur = heuristic_start(graph, budget_bytes, deadline, max_work) if start and (kept or best is None) else None
    if kept and cp_sat_may_start(deadline, len(graph)):  # NOTE [ Kept nodes in the CP-SAT model ]
        best = best or heur
        plan = kept_solver()(graph, budget_bytes, deadline, work_limit=work_limit, workers=workers, seed=seed,
                             gap_limit=gap_limit, warm_start_=False, incumbent=best)
        if plan is not None:
            return _proven(plan, KEPT) if plan.status == Status.OPTIMAL else plan
        why = f"{why}, and there are too many (region, menu entry) choices for CP-SAT's kept-node model"
    inc, bound = warm.plain or heur, None if kept else warm.bound
    try:
        plan = cp_sat_within(graph, budget_bytes, deadline, work_limit=work_limit, workers=workers, seed=seed,
                             gap_limit=gap_limit, warm_start_=False, incumbent=inc, bound=bound,
                             tried=warm.tried if warm_start else None)
    except InfeasibleBudget as exc:
        if kept and best is not None:  # no plan keeping no node fits; one keeping nodes does
            return _warm_plan(best, selective=f"not searched: {why}")
        if kept:
            raise exc.replace(scope=f"the plans that keep no node ({why})") from None
        raise
    except IlpTimeout:
        if best is None:
            raise
        return _warm_plan(best, cp_sat_stopped_by="time limit")
    if kept:
        if best is not None and best.saved and best.flops < simulate(graph, plan, record=False).recompute_cost:
            return _warm_plan(best, selective=f"not searched: {why}")
        return _regions_only(plan, why)
    return _proven(plan, over) if plan.status == Status.OPTIMAL else plan


ILP_OPTIONS = CP_SAT_OPTIONS + (
    Option("method", str, "auto (the frontier program where the graph is narrow, then CP-SAT), frontier or cp-sat",
           choices=METHODS),
    Option("blocks", bool, "let the frontier program compose repeated blocks (False: walk every node; same optimum)"),
    Option("selective", bool, "regions may keep op outputs (NOTE [ One plan space ]): exact by the frontier program, "
           "else by CP-SAT with kept nodes; False: regions that recompute everything"),
)


@register("ilp", options=ILP_OPTIONS, exact=True)
def ilp(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0, work_limit: float | None = DEFAULT_WORK_LIMIT,
        workers: int = 2, seed: int = 0, gap_limit: float = 0.0, warm_start: bool = True, method: str = "auto",
        blocks: bool = True, selective: bool = True) -> Plan:
    """Least-recompute plan under ``budget_bytes``, over regions and kept nodes, proven optimal.

    Two exact methods over the same set of plans (NOTE [ One plan space ]):
    the frontier program (NOTE [ The frontier DP ]), fast when few tensors
    cross any position of the order (transformers, chains, narrow DAGs), and
    the CP-SAT model (NOTE [ An exact model of simulate ]) for any DAG, with
    a bound and a gap. On a chain of repeated blocks (a traced LLM) the
    program crosses each block by the block's own Pareto front (NOTE
    [ Composing repeated blocks ]). The same graph and budget give the same
    plan on a busy machine wherever the searches end within their work
    (``work_limit``); ``time_limit_s`` is a promise about the wall clock
    (NOTE [ One deadline ]). OR-Tools is imported only when CP-SAT runs.

    Args:
        time_limit_s: wall clock: the call returns within this + 1 s with
            the best plan found and an honest status (NOTE [ One deadline ]).
        work_limit: about seconds of one idle core each search may take,
            counted, not timed: CP-SAT's ``max_deterministic_time``, the
            frontier program's work (NOTE [ The frontier program's work ]),
            ``dp``'s table in the warm start; None: the wall clock only
            (answers that depend on the load).
        workers: CP-SAT search workers.
        seed: CP-SAT's random seed.
        gap_limit: stop as soon as the relative gap is at most this (e.g.
            0.01); the plan is then ``feasible`` with its bound. 0: run until
            optimality is proven or a limit.
        warm_start: where CP-SAT runs, start from the cheapest fitting plan of
            store-all, ``per-module``, ``chen``, ``dp`` and ``uniform`` (NOTE
            [ Bounded warm starts ] in ``solvers.warm``): it hints the search,
            caps the objective and is returned if CP-SAT finds nothing
            cheaper, so ``ilp`` is never worse than any of them and never
            fails where one found a plan.
        method: ``auto`` (the frontier program on graphs at most
            ``frontier.MAX_WIDTH`` wide, given what the deadline leaves less
            a fifth of the limit, then CP-SAT if it did not finish),
            ``frontier`` or ``cp-sat``.
        blocks: let the frontier program compose repeated blocks (False:
            walk every node; the same optimum, for comparisons).
        selective: regions may also keep nodes (the default: NOTE [ One plan
            space ]); False: regions only.

    Returns:
        ``optimal``, or ``feasible`` with ``bound`` (and so ``gap``) where one
        is known; ``findings`` name the method that answered, the work it did,
        and the set of plans the plan is optimal over (``optimal_over``).

    Raises:
        InfeasibleBudget: carrying the least peak of any plan.
        IlpTimeout: no plan within the time limit (none of the warm-start
            solvers found one either).
        TooWide: ``method="frontier"`` on a graph too wide for the program.
        MissingDependency: CP-SAT must run and OR-Tools is not installed.
    """
    return solve_within(graph, budget_bytes, Deadline(time_limit_s), work_limit=work_limit, workers=workers, seed=seed,
                        warm_start=warm_start, gap_limit=gap_limit, method=method, blocks=blocks, selective=selective)


@register("frontier", options=(
    Option("time_limit_s", float, "wall-clock limit (NOTE [ One deadline ])", minimum=0),
    Option("work_limit", float, "about seconds of one idle core the program may work (counted: the same answer on a "
           "busy machine); None: the wall clock only", above=0, none_ok=True),
    Option("max_width", int, "refuse graphs with more tensors open at one position (the states grow as 2**width)",
           minimum=0),
    Option("blocks", bool, "compose repeated blocks by their own fronts (False: walk every node; same optimum)"),
    Option("selective", bool, "regions may keep op outputs (NOTE [ Kept nodes in the frontier DP ]): exact over "
           "(region, menu entry) pairs; False: regions only"),
), exact=True, part_of="ilp")
def frontier(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0,
             work_limit: float | None = DEFAULT_WORK_LIMIT, max_width: int = MAX_WIDTH, blocks: bool = True,
             selective: bool = True) -> Plan:
    """The exact frontier program alone (NOTE [ The frontier DP ]): graphs where few tensors cross any position.

    No warm start and no OR-Tools; deterministic. With ``selective`` its
    regions may keep nodes (the plan's ``saved``): optimal over ``(region,
    menu entry)`` pairs, or, when the kept-node program does not finish, the
    optimum over the plans keeping none, ``feasible`` (NOTE [ One plan space ]).

    Returns:
        A plan; ``findings`` carry the states explored, the work and the blocks composed.

    Raises:
        TooWide: more than ``max_width`` tensors open at one position: use
            solver ``ilp`` (it hands such graphs to CP-SAT) or ``cp-sat``.
        InfeasibleBudget: carrying the least peak of any plan.
        IlpTimeout: the program did not finish within ``time_limit_s`` or ``work_limit``.
        SolverBug: the program disagrees with ``simulate``.
    """
    try:
        return solve_within(graph, budget_bytes, Deadline(time_limit_s), work_limit=work_limit, method="frontier",
                            blocks=blocks, selective=selective, max_width=max_width, warm_start=False)
    except TooWide as exc:
        raise TooWide(exc.width, exc.max_width, exc.position) from None


@register("cp-sat", options=CP_SAT_OPTIONS + (
    Option("selective", bool, "regions may keep op outputs (NOTE [ Kept nodes in the CP-SAT model ]): exact over "
           "(region, menu entry) pairs up to solvers.cpsat.kept.MAX_CHOICES of them; above, the plan keeps none "
           "(feasible, said so); False: regions only"),
), exact=True, part_of="ilp")
def cp_sat(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0,
           work_limit: float | None = DEFAULT_WORK_LIMIT, workers: int = 2, seed: int = 0, gap_limit: float = 0.0,
           warm_start: bool = True, selective: bool = True) -> Plan:
    """The CP-SAT model alone (NOTE [ An exact model of simulate ]): any DAG, a proven bound and gap.

    ``ilp`` with ``method="cp-sat"``. Deterministic under its work limit
    (NOTE [ Deterministic CP-SAT ]): the same graph and budget give the same
    plan on a busy machine; ``time_limit_s`` is a promise about the wall
    clock (NOTE [ One deadline ]).

    Args:
        time_limit_s: wall-clock limit.
        work_limit: CP-SAT's deterministic work limit; None: the clock only.
        workers: search workers.
        seed: CP-SAT's random seed.
        gap_limit: stop once the relative gap is at most this.
        warm_start: hint the search with the cheapest fitting plan of the fast solvers.
        selective: regions may keep nodes (the default, NOTE [ One plan space ] in ``solvers.ilp``);
            past the kept-node model's size limit the plan keeps none, ``feasible``, ``findings`` say so.

    Returns:
        ``optimal``, or ``feasible`` with ``bound``; ``findings`` say how it ended.

    Raises:
        InfeasibleBudget: carrying the least peak of any plan.
        IlpTimeout: no plan within the time limit.
        MissingDependency: OR-Tools is not installed.
    """
    return solve_within(graph, budget_bytes, Deadline(time_limit_s), work_limit=work_limit, workers=workers, seed=seed,
                      gap_limit=gap_limit, warm_start=warm_start, method="cp-sat", selective=selective)


def kept_solver() -> Any:
    """``solvers.cpsat.kept.solve_selective`` (NOTE [ Kept nodes in the CP-SAT model ]), importing OR-Tools now.

    Raises:
        MissingDependency: OR-Tools is not installed.
    """
    checkpoint_model()
    from .cpsat.kept import solve_selective  # imports OR-Tools: loaded when a search runs

    return solve_selective
