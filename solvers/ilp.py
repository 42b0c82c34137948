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

import logging
import math
import time
import weakref
from dataclasses import dataclass
from typing import Any

from graphs import CkptError, Graph

from .errors import InfeasibleBudget
from .frontier import MAX_WIDTH, FrontierDP, FrontierTimeout, TooWide
from .ilp_model import CheckpointModel
from .plan import Plan, Status
from .registry import get_solver, register
from .simulate import simulate
from .spans import SpanIndex

__all__ = ["IlpTimeout", "ilp", "IlpSolver", "Incumbent", "WARM_SOLVERS", "METHODS", "frontier_program"]

log = logging.getLogger(__name__)


class IlpTimeout(CkptError, RuntimeError):
    """CP-SAT found no plan (and none was given as a hint) within the time limit."""


@dataclass(frozen=True)
class Incumbent:
    """A plan known to fit (checked with ``simulate``) and its recompute FLOPs."""

    regions: tuple[tuple[int, int], ...]
    flops: int
    source: str


class IlpSolver:
    """Build, solve and read out the CP-SAT model of one graph and budget.

    Args:
        graph: the cost graph.
        budget_bytes: whole-step budget.
        time_limit_s: CP-SAT's ``max_time_in_seconds``.
        gap_limit: stop once the relative gap is at most this (0: prove optimality).
        workers: CP-SAT search workers.
        hint: a plan (regions) to warm-start from.
        lower_bound: a proven lower bound on the recompute FLOPs (``dp``'s
            optimum on a chain), added as a constraint to close the gap.
        incumbent: a plan known to fit; it hints the search, caps the
            objective, and is returned when CP-SAT finds nothing better.
    """

    def __init__(self, graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0, workers: int = 2,
                 gap_limit: float = 0.0,
                 hint: tuple[tuple[int, int], ...] | None = None, lower_bound: int | None = None,
                 incumbent: Incumbent | None = None) -> None:
        self.graph = graph
        self.budget_bytes = int(budget_bytes)
        self.time_limit_s = time_limit_s
        self.workers = workers
        self.gap_limit = float(gap_limit)
        self.incumbent = incumbent
        self.hint = hint if hint is not None or incumbent is None else incumbent.regions
        self.lower_bound = lower_bound

    def _from_incumbent(self, bound: float | None, why: str) -> Plan:
        inc = self.incumbent
        assert inc is not None
        lb = max(float(bound) if bound is not None and bound == bound else 0.0, float(self.lower_bound or 0))
        lb = min(lb, float(inc.flops))
        optimal = lb >= inc.flops
        log.info("ilp returns the %s plan (%s): %d FLOPs, bound %.6g", inc.source, why, inc.flops, lb)
        return Plan(regions=inc.regions, status=Status.OPTIMAL if optimal else Status.FEASIBLE, bound=lb,
                    options={"time_limit_s": self.time_limit_s, "incumbent": inc.source})

    def solve(self) -> Plan:
        """Solve; a plan with status ``optimal`` or ``feasible`` (bound and gap).

        Never worse than :attr:`incumbent` when one is given.

        Raises:
            InfeasibleBudget: no interval plan fits; carries the least peak.
            IlpTimeout: no plan found within the time limit (and no incumbent).
        """
        t0 = time.perf_counter()
        cuts: list[tuple[tuple[int, int], ...]] = []
        inc = self.incumbent
        for _ in range(50):
            # Phases: variables, constraints, objective (CheckpointModel), then solve.
            model = CheckpointModel(self.graph, budget_bytes=self.budget_bytes)
            for bad in cuts:
                model.forbid(bad)
            if self.hint is not None and self.hint not in cuts:
                model.add_hint(self.hint, complete_s=min(30.0, 0.1 * self.time_limit_s + 1.0))
            if self.lower_bound is not None:
                model.add_lower_bound(self.lower_bound)
            if inc is not None:
                model.add_upper_bound(inc.flops)
            knap = model.add_memory_cuts(self.budget_bytes)
            if knap > (self.lower_bound or 0):
                log.info("ilp knapsack bound %d FLOPs", knap)
                self.lower_bound = knap
                model.add_lower_bound(knap)
            left = max(1.0, self.time_limit_s - (time.perf_counter() - t0))
            result = model.solve(time_limit_s=left, workers=self.workers, gap_limit=self.gap_limit)
            if result.status == "infeasible":
                if inc is not None:
                    # The incumbent itself satisfies the model (it is exact), so this is a model bug.
                    log.error("ilp model rejects the %s plan that simulate says fits", inc.source)
                    return self._from_incumbent(None, "model rejects it")
                left = max(1.0, self.time_limit_s - (time.perf_counter() - t0))
                least, regions, lower = self.least_peak(left)
                lower = max(lower, self.budget_bytes + 1)  # the budget itself is proven too small
                raise InfeasibleBudget(self.budget_bytes, least, solver="ilp", best_regions=regions,
                                       proven=least <= lower, lower_bound_bytes=lower,
                                       time_limit_s=None if least <= lower else self.time_limit_s)
            if result.regions is None:
                if inc is not None:
                    return self._from_incumbent(result.bound, "time limit")
                if self.hint is not None and simulate(self.graph, Plan(regions=self.hint), record=False).peak_bytes <= self.budget_bytes:
                    return Plan(regions=self.hint, status=Status.FEASIBLE, bound=result.bound,
                                options={"time_limit_s": self.time_limit_s})
                raise IlpTimeout(
                    f"no plan found within {self.time_limit_s:.3g} s for this graph ({len(self.graph)} nodes; not "
                    "proven infeasible); raise time_limit_s (--time-limit), or use solver 'dp' or 'chen'")
            sim = simulate(self.graph, Plan(regions=result.regions), record=False)
            if sim.peak_bytes <= self.budget_bytes:
                optimal = result.status == "optimal"
                bound = float(sim.recompute_cost) if optimal else float(result.bound)
                if inc is not None and inc.flops <= sim.recompute_cost:
                    # Ties go to the incumbent: CP-SAT's equal-cost plan may add free regions.
                    return self._from_incumbent(bound, "no cheaper plan found")
                return Plan(regions=result.regions, status=Status.OPTIMAL if optimal else Status.FEASIBLE,
                            bound=bound, options={"time_limit_s": self.time_limit_s})
            log.error("ilp model predicted a fit for %s but simulate says %d > %d; cutting it off",
                      result.regions, sim.peak_bytes, self.budget_bytes)
            cuts.append(result.regions)
        if inc is not None:
            return self._from_incumbent(None, "model and simulate disagree")
        raise IlpTimeout("ilp model and simulate disagree repeatedly; please report this graph")

    def least_peak(self, time_limit_s: float) -> tuple[int, tuple[tuple[int, int], ...], int]:
        """The lowest simulated peak found over all interval plans, a plan
        that reaches it, and CP-SAT's proven lower bound on the least peak
        (the two meet when it is proven; NOTE [ No unproven floor ])."""
        model = CheckpointModel(self.graph, budget_bytes=None)
        result = model.solve(time_limit_s=time_limit_s, workers=self.workers)
        peaks = _simple_peaks(self.graph) + ([(simulate(self.graph, Plan(regions=result.regions), record=False)
                                               .peak_bytes, result.regions)] if result.regions is not None else [])
        least, regions = min(peaks, key=lambda p: p[0])
        bound = result.bound if result.bound == result.bound else 0.0  # NaN when CP-SAT has none
        return least, regions, min(least, int(math.ceil(bound - 1e-6)))


def _simple_peaks(graph: Graph) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    """``(peak, regions)`` of plans any graph has: store-all, and every recomputable node its own
    region (on a graph with spans: the shortest span at each position, and the longest)."""
    index = SpanIndex(graph)
    plans = [(), index.finest()] + ([index.coarsest()] if index.aligned else [])
    return [(simulate(graph, Plan(regions=r), record=False).peak_bytes, r) for r in dict.fromkeys(plans)]


#: The fast solvers whose best fitting plan warm-starts ``ilp``.
WARM_SOLVERS = ("dp", "chen", "uniform", "per-module")


def _warm_start(graph: Graph, budget_bytes: int) -> tuple[Incumbent | None, int | None]:
    """The cheapest fitting plan of the fast solvers (per ``simulate``), and a
    proven lower bound on the cost when ``dp`` is optimal (on chains)."""
    best: Incumbent | None = None
    bound = None
    for name in WARM_SOLVERS:
        try:
            plan = get_solver(name)(graph, budget_bytes)
        except CkptError:
            continue
        if plan.unaligned_regions(graph):  # NOTE [ Module-aligned regions ]: never a hint ilp may not return
            log.error("ilp warm start: %s returned regions that are no spans; ignored", name)
            continue
        sim = simulate(graph, plan, record=False)
        if sim.peak_bytes > budget_bytes:
            continue
        if best is None or sim.recompute_cost < best.flops:
            best = Incumbent(tuple(plan.regions), int(sim.recompute_cost), name)
        if name == "dp" and plan.status == Status.OPTIMAL:
            bound = sim.recompute_cost
    return best, bound


#: ``ilp``'s methods: ``auto`` runs the frontier program on narrow graphs, CP-SAT otherwise.
METHODS = ("auto", "frontier", "cp-sat")


_PROGRAMS: dict[tuple[int, int | None, bool], tuple[Any, FrontierDP]] = {}


def frontier_program(graph: Graph, *, max_width: int | None = MAX_WIDTH, blocks: bool = True) -> FrontierDP:
    """The frontier program of ``graph``, kept for the next call on the same graph object
    (a chain's block fronts do not depend on the budget: a sweep builds them once).

    Raises:
        TooWide: more than ``max_width`` tensors open at one position (decided in linear time).
    """
    key = (id(graph), max_width, blocks)
    got = _PROGRAMS.get(key)
    if got is not None and got[0]() is graph:
        return got[1]
    program = FrontierDP(graph, max_width=max_width, blocks=blocks)
    if len(_PROGRAMS) >= 4:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = (weakref.ref(graph), program)
    return program


def _by_frontier(graph: Graph, budget_bytes: int, inc: Incumbent | None, time_limit_s: float,
                 required: bool, program: FrontierDP) -> Plan | None:
    """The optimum by the frontier program (NOTE [ The frontier DP ]), or None
    to hand the graph to CP-SAT (out of time, or a disagreement with
    ``simulate``, which is logged as the bug it would be)."""
    t0 = time.perf_counter()
    try:
        res = program.solve(budget_bytes, upper=inc.flops if inc is not None else None, time_limit_s=time_limit_s)
        if res is None and inc is None:
            # No interval plan fits: the least peak, by the same program, bounded by two plans' peaks.
            top = min(peak for peak, _ in _simple_peaks(graph))
            least = program.solve(top, objective="peak", time_limit_s=max(1.0, time_limit_s - (time.perf_counter() - t0)))
            if least is not None and least.objective > budget_bytes:
                raise InfeasibleBudget(budget_bytes, least.objective, solver="ilp", best_regions=least.regions)
            log.error("ilp frontier program found no plan under %d, yet its least peak is %s", budget_bytes,
                      None if least is None else least.objective)
            return None
    except FrontierTimeout as exc:
        if required:
            raise IlpTimeout(f"no plan found within {time_limit_s:g} s ({exc}); raise time_limit_s (--time-limit), "
                             "or use method 'auto'") from None
        log.info("ilp: %s; solving with CP-SAT", exc)
        return None
    if res is None:
        log.error("ilp frontier program rejects the %s plan that simulate says fits", inc.source)
        return None
    sim = simulate(graph, Plan(regions=res.regions), record=False)
    if sim.peak_bytes > budget_bytes or sim.recompute_cost != res.objective:
        log.error("ilp frontier program predicted %d FLOPs under %d for %s; simulate says %d FLOPs at %d",
                  res.objective, budget_bytes, res.regions, sim.recompute_cost, sim.peak_bytes)
        return None
    regions = res.regions if inc is None or res.objective < inc.flops else inc.regions
    options = {"time_limit_s": time_limit_s, "method": "frontier", "frontier_states": res.states}
    if res.blocks:
        options["blocks_composed"] = res.blocks  # NOTE [ Composing repeated blocks ]
    return Plan(regions=regions, status=Status.OPTIMAL, bound=float(res.objective), options=options)


def _frontier_heuristic(graph: Graph, budget_bytes: int, time_limit_s: float) -> Incumbent | None:
    """A plan for a graph too wide for the exact program: the program with at
    most ``k`` unheld open tensors per boundary (the rest counted as held, so
    the plan fits), for ``k`` = 0, 2, 4, 8 while the time lasts; the cheapest."""
    t0 = time.perf_counter()
    program = FrontierDP(graph, max_width=None, blocks=False)
    best: Incumbent | None = None
    for k in (0, 2, 4, 8):
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            break
        try:
            res = program.solve(budget_bytes, max_free=k, time_limit_s=left,
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


@register("ilp")
def ilp(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0, workers: int = 2,
        warm_start: bool = True, gap_limit: float = 0.0, method: str = "auto", blocks: bool = True,
        **_: Any) -> Plan:
    """Least-recompute interval plan under ``budget_bytes``, proven optimal.

    Two exact methods over the same set of plans: the frontier program
    (NOTE [ The frontier DP ]), fast when few tensors cross any position of
    the order (transformers, chains, narrow DAGs), and the CP-SAT model
    (NOTE [ An exact model of simulate ]) for any DAG, with a time limit, a
    bound and a gap. On a chain of repeated blocks (a traced LLM) the
    program crosses each block by the block's own Pareto front (NOTE
    [ Composing repeated blocks ]).

    Args:
        time_limit_s: stop after this long with the best plan and its gap.
        workers: CP-SAT search workers (threads).
        gap_limit: stop as soon as the relative gap is at most this (e.g.
            0.01); the plan is then ``feasible`` with its bound. 0: run until
            optimality is proven or the time limit.
        warm_start: start from the cheapest fitting plan of ``dp``, ``chen``,
            ``uniform`` and ``per-module``: it hints the search, caps the
            objective and is returned if CP-SAT finds nothing cheaper, so
            ``ilp`` is never worse than any of them and never fails where one
            found a plan. Where the program composes repeated blocks it runs
            first, with no warm start: it is exact, and faster than the warm
            starts (``uniform`` alone simulates 2,044 plans on a Llama op graph).
        method: ``auto`` (the frontier program on graphs at most
            ``frontier.MAX_WIDTH`` wide, given 80 % of the time limit, then
            CP-SAT if it did not finish), ``frontier`` or ``cp-sat``.
        blocks: let the frontier program compose repeated blocks (False:
            walk every node; the same optimum, for comparisons).

    Returns:
        ``optimal``, or ``feasible`` with ``bound`` (and so ``gap``) set.

    Raises:
        InfeasibleBudget: carrying the least peak of any interval plan.
        IlpTimeout: no plan within the time limit (none of the warm-start
            solvers found one either).
    """
    if method not in METHODS:
        raise CkptError(f"unknown ilp method {method!r}; choose one of {', '.join(METHODS)}")
    t0 = time.perf_counter()
    program = None
    if method != "cp-sat":
        try:
            program = frontier_program(graph, blocks=blocks)
        except TooWide as exc:
            if method == "frontier":
                raise CkptError(f"ilp method 'frontier' needs a narrow graph: {exc}; use method 'auto' or 'cp-sat'") from None
            log.info("ilp: %s; solving with CP-SAT", exc)
    # The frontier program is exact when it finishes; CP-SAT keeps a fifth of the time (or what a
    # projected overrun leaves: the program gives up early when it would not finish).
    share = time_limit_s if method == "frontier" else 0.8 * time_limit_s
    if program is not None and program.chain is not None:
        plan = _by_frontier(graph, budget_bytes, None, max(0.1, share), method == "frontier", program)
        if plan is not None:
            return plan
    inc, bound = _warm_start(graph, budget_bytes) if warm_start else (None, None)
    if inc is not None and (inc.flops == 0 or (bound is not None and inc.flops <= bound)):
        return Plan(regions=inc.regions, status=Status.OPTIMAL, bound=float(inc.flops),
                    options={"time_limit_s": time_limit_s, "incumbent": inc.source})
    if program is not None and program.chain is None:
        plan = _by_frontier(graph, budget_bytes, inc, max(0.1, share - (time.perf_counter() - t0)),
                            method == "frontier", program)
        if plan is not None:
            return plan
    if method == "auto" and warm_start and inc is None:
        # Too wide (or slow) to be exact, and no fast solver found a plan: CP-SAT would start from
        # nothing. The program's bounded-width form gives it one, in a tenth of the time limit (run
        # also where a fast plan existed, that time served CP-SAT better: 60 s random DAGs).
        inc = _frontier_heuristic(graph, budget_bytes, 0.1 * time_limit_s)
        if inc is not None:
            log.info("ilp warm start: %s, %d FLOPs", inc.source, inc.flops)
    left = max(1.0, time_limit_s - (time.perf_counter() - t0))
    try:
        return IlpSolver(graph, budget_bytes, time_limit_s=left, workers=workers, gap_limit=gap_limit,
                         lower_bound=bound, incumbent=inc).solve()
    except InfeasibleBudget as exc:
        if exc.proven:
            raise
        raise exc.replace(time_limit_s=time_limit_s) from None  # the limit the caller gave
