"""The warm starts of ``ilp`` and ``cp-sat``: the cheapest fitting plan of the fast solvers, within bounds.

NOTE [ Bounded warm starts ]
    ``ilp`` starts CP-SAT from the cheapest plan of the fast solvers that
    fits (per ``simulate``) and never answers worse than it. The warm starts
    once ran outside every limit: ``uniform`` tries every ``k`` (``n``
    simulations of ``n`` nodes: 89 s of CPU on a 5,000-node graph under a
    60 s limit), ``dp`` filled a table of stages x nodes at once (MemoryError
    at 100,000 nodes) after waiting for numba. Here every candidate plan
    costs one ``simulate`` (linear in the graph) and there are about a
    hundred at most, in this order: store-all, ``per-module``, Chen's
    ``sqrt(n)`` plan, ``dp``, Chen's greedy grid, and ``uniform`` at the ``k``
    of :func:`uniform_ks` (a geometric grid, not every ``k``); on a graph
    with spans each is snapped onto spans as those solvers do. ``dp`` runs
    only when its table's work, counted before it is filled
    (``solvers.dp.chain.fill_work``), fits :data:`DP_SHARE` of the limit at the
    rate of the kernel this process has loaded (NOTE [ The dp kernel under a
    deadline ]: never waited for), so whether it runs does not depend on the
    load; its table stays linear in memory (NOTE [ Linear memory in dp ]).
    No candidate starts with less time left than a simulation takes
    (``Deadline.pass_estimate``); ``dp`` checks the deadline as it fills.
    The candidates before ``dp`` may run on their own (``first=True``) and
    the rest later (``resume=``): ``ilp`` takes a plan in hand that way
    before the frontier program on a graph whose passes are a large part of
    the limit (NOTE [ One plan space ] in ``solvers.ilp``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from graphs import CkptError, Graph

from .baselines import _uniform_candidates, block_regions
from .chen import iter_greedy_plans, sqrt_plan
from .deadline import Deadline
from .errors import InfeasibleBudget
from .model.plan import Plan, Status
from .model.simulate import remember, simulate
from .model.spans import SpanIndex

__all__ = ["Incumbent", "Warm", "warm_starts", "simple_peaks", "uniform_ks", "DP_SHARE"]

log = logging.getLogger(__name__)

#: The share of the limit (the work limit, else the time limit) ``dp``'s table may take in a warm start.
DP_SHARE = 0.25
#: Segment counts ``uniform`` is tried at in a warm start, at most.
UNIFORM_TRIES = 48

Regions = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Incumbent:
    """A plan known to fit (checked with ``simulate``), its recompute cost and who found it."""

    regions: Regions
    flops: int
    source: str
    saved: tuple[int, ...] = ()


@dataclass(frozen=True)
class Warm:
    """What the warm starts found.

    Attributes:
        best: the cheapest plan that fits (it may keep nodes when kept nodes were asked for).
        plain: the cheapest plan that fits and keeps no node (a hint for the CP-SAT model without kept nodes).
        bound: ``dp``'s cost where ``dp`` is proven optimal (a chain): a lower bound over the plans it
            searched (with kept nodes when asked for), else None.
        tried: the fast solvers that ran and found no plan under the budget (a stop never advises them).
        ran: the fast solvers that ran (with ``tried``: what a resumed run starts from).
        sim: ``best``'s simulation (the read-out reuses it).
        seen: the plans without kept nodes simulated (a resumed run does not simulate them again).
    """

    best: Incumbent | None = None
    plain: Incumbent | None = None
    bound: int | None = None
    tried: tuple[str, ...] = ()
    ran: tuple[str, ...] = ()
    sim: Any = field(default=None, compare=False, repr=False)
    seen: frozenset = field(default=frozenset(), compare=False, repr=False)


def uniform_ks(n: int) -> list[int]:
    """At most :data:`UNIFORM_TRIES` segment counts from 1 to ``n``: every one up to 16, then a geometric grid."""
    if n <= UNIFORM_TRIES:
        return list(range(1, n + 1))
    ks = list(range(1, 17))
    steps = UNIFORM_TRIES - len(ks)
    ratio = (n / 16) ** (1 / steps)
    ks += [round(16 * ratio ** i) for i in range(1, steps + 1)]
    return sorted(set(min(n, k) for k in ks))


def _snapped(graph: Graph, plans: Iterable[Regions]) -> Iterator[Regions]:
    if not graph.spans:
        yield from plans
        return
    index = SpanIndex(graph)
    for regions in plans:
        yield from index.snap(regions)


def _candidates(graph: Graph, part: str | None = None) -> Iterator[tuple[str, Regions]]:
    """The cheap candidates, in order, each plan once (``None`` marks where ``dp`` goes); ``part``: "first"
    (those before ``dp``), "rest" (``dp`` on) or None (all)."""
    seen: set[Regions] = set()

    def each(pairs: Iterable[tuple[str, Regions]]) -> Iterator[tuple[str, Regions]]:
        for source, regions in pairs:
            if regions not in seen:
                seen.add(regions)
                yield source, regions

    if part != "rest":
        yield from each([("store-all", ())])
        try:
            yield from each([("per-module", tuple(block_regions(graph)))])
        except CkptError:
            pass
        yield from each(("chen", regions) for regions in _snapped(graph, [sqrt_plan(graph)]))
    if part != "first":
        yield "dp", None  # type: ignore[misc]
        yield from each(_rest(graph))


def _rest(graph: Graph) -> Iterator[tuple[str, Regions]]:
    """The candidates after ``dp``: Chen's greedy grid, one threshold at a time, and ``uniform``."""
    yield from (("chen", regions) for regions in _snapped(graph, iter_greedy_plans(graph)))
    yield from (("uniform", regions) for _, regions in _uniform_candidates(graph, uniform_ks(len(graph))))


def _dp(graph: Graph, budget_bytes: int, deadline: Deadline | None, work_limit: float | None, limit_s: float | None,
        selective: bool) -> Plan | None:
    """``dp``'s plan when its table fits its share of the limit (NOTE [ Bounded warm starts ]), else None;
    raises :class:`~solvers.errors.InfeasibleBudget` when its table holds no plan under the budget."""
    from .dp.chain import DEFAULT_MAX_FRONT, dp_answer, dp_table

    limits = [x for x in (work_limit, limit_s) if x is not None]
    try:
        table = dp_table(graph, max_front=DEFAULT_MAX_FRONT, selective=selective, deadline=deadline or Deadline(math.inf),
                         max_s=DP_SHARE * min(limits) if limits else None)  # never waits for numba
        plan = dp_answer(graph, table, budget_bytes)
    except InfeasibleBudget:
        raise
    except (CkptError, MemoryError) as exc:  # OutOfTime (work or time), or no memory
        log.info("ilp warm start: dp gave no plan (%s)", exc or type(exc).__name__)
        return None
    if plan.unaligned_regions(graph):  # NOTE [ Module-aligned regions ]: never a hint ilp may not return
        log.error("ilp warm start: dp returned regions that are no spans; ignored")
        return None
    return plan


def simple_peaks(graph: Graph) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    """``(peak, regions)`` of plans any graph has: store-all, and every recomputable node its own
    region (on a graph with spans: the shortest span at each position, and the longest)."""
    index = SpanIndex(graph)
    plans = [(), index.finest()] + ([index.coarsest()] if index.aligned else [])
    return [(simulate(graph, Plan(regions=r), record=False).peak_bytes, r) for r in dict.fromkeys(plans)]


def warm_starts(graph: Graph, budget_bytes: int, deadline: Deadline | None = None, *,
                work_limit: float | None = None, selective: bool = False, limit_s: float | None = None,
                first: bool = False, resume: Warm | None = None) -> Warm:
    """The cheapest fitting plans of the fast solvers, within the deadline (NOTE [ Bounded warm starts ]).

    Args:
        graph: the cost graph.
        budget_bytes: whole-step budget.
        deadline: nothing starts once it has passed (None: no limit).
        work_limit: about seconds of one idle core; bounds ``dp``'s table (None: the time limit does).
        selective: ``dp`` may keep nodes (its plan then counts for :attr:`Warm.best` only).
        limit_s: the solve's time limit, which also bounds ``dp``'s table (default: ``deadline``'s).
        first: only the candidates before ``dp`` (store-all, ``per-module``, Chen's ``sqrt(n)`` plan).
        resume: what a run with ``first`` found: its candidates are not run again.
    """
    if resume is not None and resume.best is not None and resume.best.flops == 0:
        return resume  # recomputes nothing: nothing is cheaper
    if limit_s is None and deadline is not None:
        limit_s = deadline.limit_s
    best, plain, bound, best_sim = (resume.best, resume.plain, resume.bound, resume.sim) if resume else (None,) * 4
    seen: set[tuple[Regions, tuple[int, ...]]] = set()
    ran: set[str] = set(resume.ran) if resume else set()
    fit: set[str] = ran - set(resume.tried) if resume else set()
    if resume is not None:
        seen.update((regions, ()) for regions in resume.seen)
    n = len(graph)
    # Making a candidate (Chen's plans: a pass or less) and simulating it (a pass) each start only with a pass
    # left; a pass is timed again on each simulation (the load may have grown since the solve timed one).
    candidates = _candidates(graph) if not (first or resume) else _candidates(graph, "first" if first else "rest")
    while deadline is None or not (deadline.expired() or deadline.left() < deadline.pass_estimate(n)):
        source, regions = next(candidates, ("", ()))
        if not source:
            break
        if deadline is not None and (deadline.expired() or deadline.left() < deadline.pass_estimate(n)):
            log.info("ilp warm start: out of time before %s", source)  # a simulation would overrun the deadline
            break
        saved: tuple[int, ...] = ()
        optimal = False
        if regions is None:  # dp's turn
            try:
                plan = _dp(graph, budget_bytes, deadline, work_limit, limit_s, selective)
            except InfeasibleBudget:
                ran.add(source)
                continue
            if plan is None:
                continue
            regions, saved, optimal = tuple(plan.regions), tuple(plan.saved), plan.status == Status.OPTIMAL
        if (regions, saved) in seen:
            continue
        seen.add((regions, saved))
        ran.add(source)
        started = deadline.clock() if deadline is not None else 0.0
        sim = simulate(graph, Plan(regions=regions, saved=saved), record=False)
        if deadline is not None:
            deadline.pass_s = max(deadline.pass_s or 0.0, deadline.clock() - started)
        if sim.peak_bytes > budget_bytes:
            continue
        fit.add(source)
        inc = Incumbent(regions, int(sim.recompute_cost), source + (" (kept nodes)" if saved else ""), saved)
        if optimal:
            bound = inc.flops
        if best is None or inc.flops < best.flops:
            best, best_sim = inc, sim
        if not saved and (plain is None or inc.flops < plain.flops):
            plain = inc
        if inc.flops == 0:
            break  # recomputes nothing: nothing is cheaper
    if best is not None:
        remember(graph, Plan(regions=best.regions, saved=best.saved), best_sim)  # the read-out reuses it
        log.info("ilp warm start: %s, %d FLOPs%s", best.source, best.flops,
                 "" if bound is None else f" (dp's optimum: {bound})")
    return Warm(best, plain, bound, tuple(s for s in ("dp", "chen", "uniform", "per-module") if s in ran - fit),
                tuple(sorted(ran)), best_sim, frozenset(regions for regions, saved in seen if not saved))
