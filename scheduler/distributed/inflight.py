"""One stage's plan when it holds several micro-batches at once: exact, by bounding what a plan retains.

NOTE [ Solving with micro-batches in flight ]
    A stage holding ``k`` micro-batches at its peak (NOTE [ Micro-batches in
    flight ] in ``scheduler.distributed.schedule``) runs one of them while the
    ``k - 1`` others hold what their forward retained, so a plan ``p`` costs
    the stage ``V(p) = P(p) + (k - 1) * R(p)``, with ``P`` the step's peak and
    ``R`` the bytes held from the end of the forward to the backward (both by
    ``simulate``, on the stage's graph with its parameters and gradients
    held throughout: after the first micro-batch a stage's gradients exist
    for the whole of every later one, and each backward's new gradients are
    made before they are added into them). The fewest recompute FLOPs under
    ``V(p) <= B`` is what a stage's plan minimises. (It counts every
    gradient at a stage's first backward too, where they are still being
    made, as under GPipe: conservative there; the rank's predicted peak
    walks the schedule's order instead, ``schedule.rank_peak``.)

    The exact solvers bound ``P`` only. Bounding ``R`` too takes one node,
    the *ballast*, appended after the last node ``L``: it reads nothing,
    holds nothing but ``W`` bytes of workspace in its forward and backward
    step, and, being last, takes the ``ones`` of ``backward()`` (no bytes) in
    place of ``L``'s gradient, whose bytes move into the graph's
    ``param_bytes`` (the gradients of unattributed parameters, made at the
    start of the backward and held to the end) and as much out of
    ``input_bytes``, so the forward is unchanged. Every step of the original
    graph then costs what it did; the ballast's backward step, the first of
    the backward, holds ``R + W`` above the persistent bytes ``K`` and that
    gradient's ``o``, so a plan fits budget ``b`` exactly when ``P <= b`` and
    ``R <= r`` for ``W = b - K - o - r``. (When ``K`` is less than ``o``,
    every step is over by the same difference, and the budget is raised by
    it.)

    With that oracle ``O(r, b)`` (least recompute with ``R <= r``, ``P <=
    b``), a branch and bound over ``r``: the plans whose ``R`` lies in
    ``[lo, hi]`` cost at least ``O(hi, B - (k - 1) * lo)``, and when that
    plan meets ``V <= B`` it is the best of them; otherwise the interval is
    halved, and ``O(mid, B - (k - 1) * mid)``, a plan that fits, is tried
    as the best so far. An interval of one value of ``r`` is always settled;
    one whose ``(k - 1) * (hi - lo)`` is at most the tolerance (default
    0.1 % of the budget) takes ``O(hi, B - (k - 1) * hi)``, which costs no
    more than any plan of that interval fitting ``B`` less the tolerance.
    So the answer fits ``B`` and costs at most the optimum at ``B`` less the
    tolerance, over the plans the inner solver is exact over (``ilp``:
    every span-aligned interval plan); ``optimal`` with tolerance 0 once
    every interval closed, else ``feasible`` with the least open bound. On a
    Llama-2-7B stage (16 blocks, 2 micro-batches in flight) the first
    version split at the cut-off plan's ``R`` instead of halving: 48 solves
    walked down ``R`` by one region at a time without closing.
"""

from __future__ import annotations

import dataclasses
import heapq
import inspect
import logging
from dataclasses import dataclass
from typing import Any

import solvers
from graphs import Graph, Node
from solvers import InfeasibleBudget, Plan, Status, simulate
from solvers.frontier.program import FrontierTimeout
from solvers.ilp import IlpTimeout
from solvers.model.meter import FORWARD
from solvers.registry import check_options, finalize

from .schedule import ChunkMemory
from .stages import saved_scalar_bytes

__all__ = ["STOPPED", "StoppedSearch", "stopped_search", "time_limit_of", "InflightSolve", "persistent_graph", "ballast_graph", "chunk_memory", "solve_inflight", "stage_value"]

log = logging.getLogger(__name__)

#: What an inner solver raises when its time limit stopped it without a plan (nothing known either way).
STOPPED = (IlpTimeout, FrontierTimeout)


class StoppedSearch(InfeasibleBudget):
    """A stage's search found no plan because its inner solves were stopped (by their time limit, or a work
    limit), not because none fits: nothing is proven either way.

    Attributes:
        by: ``"time limit"`` or ``"work limit"``.
        time_limit_s: the time limit of each inner solve (None when unknown or stopped by a work limit).
    """

    def __init__(self, budget_bytes: int, min_feasible_bytes: int | None = None, *, by: str = "time limit",
                 time_limit_s: float | None = None) -> None:
        self.by = by
        seen = budget_bytes if min_feasible_bytes is None else min_feasible_bytes
        super().__init__(budget_bytes, seen, proven=False, time_limit_s=time_limit_s if by == "time limit" else None)

    @property
    def text(self) -> str:
        """``stopped at the time limit (no plan found in 60 s)``: what a table says in place of a plan."""
        within = f" in {self.time_limit_s:g} s" if self.time_limit_s is not None else ""
        return f"stopped at the {self.by} (no plan found{within})"


def time_limit_of(solver: str, options: dict[str, Any]) -> float | None:
    """The time limit each inner solve of ``solver`` runs under: ``options``' or the solver's default."""
    if options.get("time_limit_s") is not None:
        return float(options["time_limit_s"])
    try:
        default = inspect.signature(solvers.get_solver(solver)).parameters["time_limit_s"].default
    except (KeyError, ValueError, TypeError):
        return None
    return None if default is inspect.Parameter.empty or default is None else float(default)


def stopped_search(exc: BaseException, budget_bytes: int, solver: str, options: dict[str, Any]
                   ) -> StoppedSearch | None:
    """``exc`` as a :class:`StoppedSearch` when it says a time or work limit stopped a search before it found
    a plan (an inner solver's timeout, or an unproven ``InfeasibleBudget`` with its time limit and no proof
    that the budget is too small); None otherwise."""
    if isinstance(exc, StoppedSearch):
        return exc
    if isinstance(exc, STOPPED):
        by = getattr(exc, "by", "time limit")
        return StoppedSearch(budget_bytes, by=by, time_limit_s=time_limit_of(solver, options))
    if isinstance(exc, InfeasibleBudget) and not exc.proven and exc.time_limit_s is not None and (
            exc.lower_bound_bytes is None or exc.lower_bound_bytes <= exc.budget_bytes):
        return StoppedSearch(budget_bytes, time_limit_s=exc.time_limit_s)
    return None
#: Oracle calls a stage's search may make before it answers with the best plan found.
MAX_SOLVES = 64
#: The default tolerance of the search over ``R``, a share of the budget
#: (NOTE [ Solving with micro-batches in flight ]).
TOLERANCE = 0.001


@dataclass(frozen=True)
class InflightSolve:
    """A stage's plan with ``inflight`` micro-batches held (NOTE [ Solving with micro-batches in flight ]).

    Attributes:
        plan: the plan, on the stage's graph (costed by ``simulate`` there).
        inflight: micro-batches held at the stage's peak.
        value_bytes: ``P + (inflight - 1) * R`` with the gradients held throughout (``simulate``'s
            categories): what the plan was solved against.
        memory: per micro-batch, above ``base_bytes`` (:class:`~scheduler.distributed.schedule.ChunkMemory`).
        base_bytes: the stage's parameters and inputs (buffers included).
        status: ``optimal`` when the search closed over exact answers, else ``feasible``.
        bound: the least recompute cost no plan can beat (None when unknown).
        solves: inner solver calls made.
    """

    plan: Plan
    inflight: int
    value_bytes: int
    memory: ChunkMemory
    base_bytes: int
    status: str
    bound: float | None
    solves: int


def persistent_graph(graph: Graph) -> Graph:
    """``graph`` with its parameters and their gradients held for the whole step (as ``input_bytes``): a
    stage's gradients exist from its first micro-batch's backward on. A node's backward then makes its new
    gradient before adding it into the held one (``AccumulateGrad``): that gradient is charged as the
    node's workspace (in its forward too, where it does not exist: conservative)."""
    grads = sum(nd.param_bytes for nd in graph.nodes)
    held = graph.input_bytes + graph.param_bytes + grads + graph.unattributed_grad_bytes()  # frozen: no gradient
    nodes = [dataclasses.replace(nd, param_bytes=0, workspace_bytes=nd.workspace_bytes + nd.param_bytes)
             if nd.param_bytes else nd for nd in graph.nodes]
    return graph.with_nodes(nodes, param_bytes=0, frozen_param_bytes=0, input_bytes=held)


def _seed_bytes(graph: Graph) -> int:
    last = graph.nodes[-1]
    return last.out_bytes if last.requires_grad else 0


def ballast_graph(graph: Graph, workspace_bytes: int) -> tuple[Graph, int]:
    """``(graph with the ballast, shift)`` for a graph from :func:`persistent_graph` (NOTE [ Solving with
    micro-batches in flight ]): every step of the ballast graph but the ballast's own holds ``shift`` bytes
    more than the same step of ``graph`` (0 unless its persistent bytes are fewer than those moved)."""
    moved = _seed_bytes(graph)
    ballast = Node(name=f"{graph.nodes[-1].name}__ballast", out_bytes=0, workspace_bytes=int(workspace_bytes),
                   requires_grad=True, recomputable=False, op="ballast")
    shift = max(0, moved - graph.input_bytes)
    return graph.with_nodes(graph.nodes + (ballast,), param_bytes=moved,
                            input_bytes=max(0, graph.input_bytes - moved)), shift


def chunk_memory(graph: Graph, plan: Plan | None) -> ChunkMemory:
    """What one micro-batch of ``plan`` holds on ``graph`` (a stage's rank graph), above its parameters and
    inputs: by ``simulate`` with the gradients made as it goes and with them held, and ``R`` as the
    ballast's forward step sees it."""
    return _evaluate(graph, plan)[0]


def _evaluate(graph: Graph, plan: Plan | None) -> tuple[ChunkMemory, int]:
    """(:func:`chunk_memory`, the plan's recompute cost)."""
    bare = None if plan is None else Plan(regions=plan.regions, saved=plan.saved)
    base = graph.param_bytes + graph.input_bytes
    plain = simulate(graph, bare)
    held = persistent_graph(graph)
    full = simulate(held, bare)
    g, _ = ballast_graph(held, 0)
    end = simulate(g, bare)
    z = len(g.nodes) - 1
    retained = next(live for (phase, node), live in zip(end.steps, end.live_bytes) if phase == FORWARD and node == z)

    def most(sim, forward: bool) -> int:
        return max((live for (phase, _), live in zip(sim.steps, sim.live_bytes) if (phase == FORWARD) == forward),
                   default=base) - base

    sent = sum(nd.out_bytes for nd in graph.nodes if nd.op == "stage_input" and nd.requires_grad)
    scalars = saved_scalar_bytes(graph)  # each micro-batch's own (NOTE [ What a rank holds ])
    memory = ChunkMemory(retained_bytes=retained - g.input_bytes - g.param_bytes + scalars,
                         forward_bytes=most(plain, True),
                         first_backward_bytes=most(plain, False), backward_bytes=most(full, False),
                         grad_bytes=held.input_bytes - base, sent_bytes=sent, held_peak_bytes=full.peak_bytes - base)
    return memory, plain.recompute_cost


def stage_value(memory: ChunkMemory, inflight: int) -> int:
    """``P + (inflight - 1) * R`` above the stage's parameters and inputs, ``P`` on the graph a stage's plan is
    solved on (:func:`persistent_graph`), plus the gradient a pending send holds (one of them: ``R`` holds
    what it received, as large; ``schedule.rank_peak`` walks the order for the peak predicted)."""
    return memory.held_peak_bytes + (inflight - 1) * memory.retained_bytes + memory.sent_bytes


@dataclass(frozen=True)
class _Answer:
    regions: tuple[tuple[int, int], ...]
    saved: tuple[int, ...]
    memory: ChunkMemory
    cost: int
    proven: bool
    solver: str
    options: dict[str, Any]
    findings: dict[str, Any]


def solve_inflight(graph: Graph, budget_bytes: int, inflight: int, *, held_grads: bool | None = None,
                   solver: str = "ilp", max_solves: int = MAX_SOLVES, tolerance_bytes: int | None = None,
                   first_fit: bool = False, **options: Any) -> InflightSolve:
    """The least-recompute plan of a stage holding ``inflight`` micro-batches within ``budget_bytes``.

    Args:
        graph: the stage's per-rank graph (``scheduler.distributed.ranks.rank_graph``).
        budget_bytes: what ``simulate``'s categories may reach on the rank.
        inflight: micro-batches held at the stage's peak.
        held_grads: count the gradients as held for the whole step (they are from the second
            micro-batch on); default: when ``inflight > 1``.
        solver: the inner solver (exact ones make the answer exact).
        max_solves: inner solver calls before answering with the best plan found.
        tolerance_bytes: the search stops splitting an interval of ``R`` once ``(inflight - 1)`` times its
            width is at most this: the plan then costs no more than the best one within ``budget_bytes``
            less the tolerance (default :data:`TOLERANCE` of the budget; 0: exact).
        first_fit: answer with the first plan that fits (a feasibility check).
        **options: the inner solver's options.

    Raises:
        InfeasibleBudget: no plan fits; ``min_feasible_bytes`` is the least stage peak over the plans tried
            (not proven least; the budget itself when no plan was seen at all). A :class:`StoppedSearch` when
            a time (or work) limit stopped an inner solve and no plan was found.
    """
    held_grads = inflight > 1 if held_grads is None else held_grads
    sent = sum(nd.out_bytes for nd in graph.nodes if nd.op == "stage_input" and nd.requires_grad)
    # what the graph's steps may reach beside a pending send and the saved scalars of the other micro-batches
    # (NOTE [ What a rank holds ]: ``simulate`` counts one micro-batch's, in the graph's inputs)
    room = budget_bytes - sent - (inflight - 1) * saved_scalar_bytes(graph)
    if inflight == 1:
        target = persistent_graph(graph) if held_grads else graph
        found = solvers.solve(target, room, solver=solver, **options)
        plan = found if target is graph else _restamp(graph, found.regions, found.saved, budget_bytes, found.status,
                                                       found.bound, found.solver, found.options, found.findings)
        mem = chunk_memory(graph, plan)
        value = int(found.peak_bytes or 0) + sent
        return InflightSolve(plan, 1, value, mem, graph.param_bytes + graph.input_bytes, plan.status, plan.bound, 1)
    fn = solvers.get_solver(solver)
    checked = check_options(fn, solver, dict(options))
    base = persistent_graph(graph)
    held = base.input_bytes
    fixed = graph.param_bytes + graph.input_bytes
    seed = _seed_bytes(base)
    k = inflight
    tolerance = int(TOLERANCE * budget_bytes) if tolerance_bytes is None else int(tolerance_bytes)
    calls = 0
    tried: list[int] = []
    stops: list[StoppedSearch] = []  # inner solves stopped by a limit

    def oracle(r: int, b: int) -> _Answer | None | _Unproven:
        """The least recompute with ``R <= r`` and ``P <= b`` (NOTE [ Solving with micro-batches in flight ])."""
        nonlocal calls
        calls += 1
        g, shift = ballast_graph(base, max(0, b - held - seed - r))
        try:
            raw = fn(g, b + shift, **checked)
        except InfeasibleBudget as exc:
            if exc.best_regions is not None:
                memory, _ = _evaluate(graph, Plan(regions=exc.best_regions))
                tried.append(fixed + stage_value(memory, k))
            if not exc.proven and (stop := stopped_search(exc, budget_bytes, solver, checked)) is not None:
                stops.append(stop)
            return None if exc.proven else _Unproven()
        except STOPPED as exc:
            log.info("in-flight search: an inner solve stopped without a plan (%s)", exc)
            stops.append(stopped_search(exc, budget_bytes, solver, checked))  # type: ignore[arg-type]
            return _Unproven()
        memory, cost = _evaluate(graph, Plan(regions=raw.regions, saved=raw.saved))
        tried.append(fixed + stage_value(memory, k))
        return _Answer(raw.regions, raw.saved, memory, cost, raw.status == Status.OPTIMAL, solver, checked,
                       dict(raw.findings))

    def fits(a: _Answer) -> bool:
        return fixed + stage_value(a.memory, k) <= budget_bytes

    best: _Answer | None = None
    r_top = max(0, (room - held - seed) // k)
    heap: list[tuple[float, int, int]] = [(float("-inf"), 0, r_top)]
    open_bound: float | None = None
    proven = True
    while heap:
        lb, lo, hi = heapq.heappop(heap)
        if best is not None and (lb >= best.cost or first_fit):
            continue
        if calls >= max_solves:
            open_bound = lb if open_bound is None else min(open_bound, lb)
            proven = False
            continue
        res = oracle(hi, room - (k - 1) * lo)  # every plan with R in [lo, hi] that fits costs at least this
        if isinstance(res, _Unproven):
            proven = False
            continue
        if res is None or (best is not None and res.cost >= best.cost):
            continue
        proven = proven and res.proven
        if fits(res):
            best = res
            continue
        if (k - 1) * (hi - lo) <= tolerance:  # NOTE [ Solving with micro-batches in flight ]: within tolerance
            corner = oracle(hi, room - (k - 1) * hi)
            if isinstance(corner, _Answer) and (best is None or corner.cost < best.cost):
                best = corner
            proven = proven and tolerance == 0
            open_bound = res.cost if open_bound is None else min(open_bound, res.cost)
            continue
        mid = (lo + hi) // 2
        probe = oracle(mid, room - (k - 1) * mid)  # a plan that fits, to prune with
        if isinstance(probe, _Answer) and (best is None or probe.cost < best.cost):
            best = probe
        heapq.heappush(heap, (res.cost, lo, mid))
        heapq.heappush(heap, (res.cost, mid + 1, hi))
    if best is None:
        least = max(min(tried), budget_bytes + 1) if tried else budget_bytes  # budget_bytes: no plan seen at all
        if stops:  # a limit stopped some search: nothing proven, the stage is "stopped", not "no plan fits"
            raise StoppedSearch(budget_bytes, least if tried else None, by=stops[0].by,
                                time_limit_s=stops[0].time_limit_s)
        raise InfeasibleBudget(budget_bytes, least, proven=False,
                               lower_bound_bytes=budget_bytes + 1 if proven else None)
    optimal = proven and best.proven and open_bound is None and not first_fit
    bound = None if open_bound is None else float(min(open_bound, best.cost))
    plan = _restamp(graph, best.regions, best.saved, budget_bytes, Status.OPTIMAL if optimal else Status.FEASIBLE,
                    bound, best.solver, best.options, {**best.findings, "inflight": k, "inner_solves": calls})
    value = fixed + stage_value(best.memory, k)
    return InflightSolve(plan, k, value, best.memory, fixed, plan.status, plan.bound, calls)


def _restamp(graph: Graph, regions: Any, saved: Any, budget_bytes: int, status: str, bound: float | None,
             solver: str, options: dict[str, Any], findings: dict[str, Any]) -> Plan:
    """Regions found on a graph derived from ``graph`` (same nodes first) as a plan of ``graph``."""
    plan = dataclasses.replace(Plan.from_regions(graph, regions, saved=saved), status=status, bound=bound,
                               findings=findings)
    return finalize(graph, plan, budget_bytes, solver, dict(options), 0.0)


class _Unproven:
    """An inner solve stopped by its time limit without a plan: nothing is known of its interval."""
