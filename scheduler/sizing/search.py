"""The largest batch (or sequence) that fits a card, per solver: the search (``fit``, in ``scheduler.sizing.fit``,
runs it for one card or, through ``scheduler.distributed.fit``, for a parallel layout).

``fit(model, "24GiB", search="batch")`` answers "what can I train on this
card, and what does it cost?": it subtracts the persistent state (weights,
gradients, optimizer state, master copy, reserve; ``scheduler.sizing.memory``) from
the card, then searches the largest size whose step each solver can plan
under what is left, re-tracing the model at every size it probes (shapes
change) and checking every answer with ``simulate``.

NOTE [ Size search ]
    For one solver, ``fits(size)`` is "the solver returns a plan whose
    simulated peak is within the budget". It is monotone for the optimal
    solvers and store-all (a larger batch never needs less memory), so the
    search gallops (1, 2, 4, ... sizes in units of ``multiple_of``) until the
    first failure or ``max_size``, then bisects between the last success and
    the first failure: ``O(log size)`` traces, each cached so that solvers
    share them. For a heuristic that is not monotone the answer is still a
    size that was probed and fits, with the next size up failing.

NOTE [ One solver's stop ]
    A solver that stops without an answer at some size (its time limit
    passed with no plan, an unproven "infeasible", any error of the
    project's, e.g. OR-Tools missing) does not fit there as far as the
    search can tell: its search goes on below that size, the probe and the
    solver's answer carry the reason (``stop``), and every other solver's
    answer stands. One ``IlpTimeout`` used to end ``ckpt fit`` with exit
    status 2 and drop every other solver's answer.
    ``tests/scheduler/sizing/test_fit.py::test_one_solvers_stop_keeps_the_others``.
"""

from __future__ import annotations

import dataclasses

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import solvers
from graphs import CkptError, Graph
from solvers import InfeasibleBudget, Plan, format_bytes, simulate

from .budget import BudgetError, parse_size
from .sized import SizedModel, sized_model
from .memory import (
    MemoryReport, NothingFits, PersistentState, PlanMemory, ReserveSpec, check_state_fits, dtype_bytes, levers,
    memory_report, persistent_state, plan_memory,
)

__all__ = ["Probe", "SolverFit", "FitResult", "SizedModel", "search_largest", "fit_graphs", "sized_model",
           "DEFAULT_SOLVERS"]

log = logging.getLogger(__name__)

#: Solvers searched when none are named (those registered), ``ilp`` the default (NOTE [ The plan fit reports ]).
DEFAULT_SOLVERS = ("store-all", "ilp", "dp", "chen", "per-module")


@dataclass(frozen=True)
class Probe:
    """One size tried for one solver (what the progress callback receives).

    Attributes:
        solver: the solver name.
        size: the size tried.
        fits: whether a plan within the budget was found.
        peak_bytes: the plan's simulated whole-step peak (None without a plan).
        recompute_ratio: recompute FLOPs over the step's FLOPs (None without a plan).
        min_feasible_bytes: without a plan, the least budget the solver needs.
        phase: ``gallop`` or ``bisect``.
        stop: why the solver gave no answer here (NOTE [ One solver's stop ]), "" when it answered.
        card_extra_bytes: what the card holds beyond ``simulate``'s peak (optimizer state, master weights, the
            reserve): ``peak_bytes`` plus this is the step's total on the card, the figure fit's table shows.
    """

    solver: str
    size: int
    fits: bool
    peak_bytes: int | None = None
    recompute_ratio: float | None = None
    min_feasible_bytes: int | None = None
    phase: str = "gallop"
    stop: str = ""
    card_extra_bytes: int = 0


@dataclass(frozen=True)
class SolverFit:
    """The search's answer for one solver.

    Attributes:
        solver: the solver name.
        size: the largest size that fits (None: not even the smallest).
        peak_bytes: the simulated peak at that size (whole step, ``simulate``'s count).
        recompute_ratio: the recompute overhead paid at that size.
        plan: the plan at that size.
        capped: the search stopped at ``max_size`` (larger may fit).
        probes: every size tried, in order.
        stop: where the solver first stopped without an answer and why
            (NOTE [ One solver's stop ]: a larger size may fit), "" if it never did.
    """

    solver: str
    size: int | None
    peak_bytes: int | None = None
    recompute_ratio: float | None = None
    plan: Plan | None = None
    capped: bool = False
    probes: tuple[Probe, ...] = ()
    stop: str = ""


@dataclass(frozen=True)
class FitResult:
    """Result of :func:`fit` / :func:`fit_graphs`.

    Attributes:
        dimension: what was searched (``batch`` or ``seq``).
        fixed: the other sizes held fixed.
        results: one :class:`SolverFit` per solver, in the order asked.
        report: the step's memory by category at the largest size any solver
            reached (every solver's activations at that size).
        traces: how many sizes were traced.
        elapsed_s: wall time of the search.
        target: what the traces planned for (their ``graph.meta["target"]``, NOTE [ Trace targets ]).
    """

    dimension: str
    fixed: Mapping[str, int]
    results: tuple[SolverFit, ...]
    report: MemoryReport
    traces: int
    elapsed_s: float
    target: Mapping[str, Any] = field(default_factory=dict)

    def result(self, solver: str) -> SolverFit:
        """The :class:`SolverFit` of ``solver`` (KeyError if it was not searched)."""
        for r in self.results:
            if r.solver == solver:
                return r
        raise KeyError(solver)

    def best(self) -> SolverFit | None:
        """The answer ``fit`` reports (NOTE [ The plan fit reports ]); None when no solver fits.

        NOTE [ The plan fit reports ]
            The largest size; among those, the least recompute (the cost the
            solvers minimise, ``Plan.recompute_cost``); among those, the first
            solver asked (``ilp`` first by default, :data:`DEFAULT_SOLVERS`:
            exact where it proves it, and never without a plan where a fast
            solver has one). ``ckpt fit -o`` writes this plan unless
            ``--plan-solver`` names another.
        """
        fits = [r for r in self.results if r.size is not None and r.plan is not None]
        return min(fits, key=lambda r: (-r.size, r.plan.recompute_cost or 0, self.results.index(r)), default=None)


def search_largest(fits: Callable[[int, str], bool], lo: int, hi: int, *, multiple_of: int = 1) -> tuple[int | None, bool]:
    """Largest ``size`` in ``[lo, hi]`` (a multiple of ``multiple_of``) with ``fits(size)``.

    Gallops from the smallest size, doubling, then bisects (NOTE [ Size
    search ]). ``fits(size, phase)`` gets ``"gallop"`` or ``"bisect"``.

    Returns:
        ``(size, capped)``: size None when the smallest does not fit; capped
        when ``hi`` itself fits.

    Raises:
        BudgetError: an empty range.
    """
    if multiple_of < 1:
        raise BudgetError(f"multiple_of must be >= 1, got {multiple_of}")
    k_lo, k_hi = -(-max(lo, 1) // multiple_of), hi // multiple_of
    if k_lo > k_hi:
        raise BudgetError(f"no multiple of {multiple_of} lies in [{lo}, {hi}]; widen the range")
    if not fits(k_lo * multiple_of, "gallop"):
        return None, False
    good = k_lo
    bad = None
    while good < k_hi:
        nxt = min(2 * good, k_hi)
        if fits(nxt * multiple_of, "gallop"):
            good = nxt
        else:
            bad = nxt
            break
    if bad is None:
        return good * multiple_of, True
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid * multiple_of, "bisect"):
            good = mid
        else:
            bad = mid
    return good * multiple_of, False


class _Trials:
    """Traces and solves, each done at most once per (size) / (solver, size)."""

    def __init__(self, model: SizedModel, budget_bytes: int, solver_options: Mapping[str, Mapping[str, Any]],
                 progress: Callable[[Probe], None] | None) -> None:
        self.model = model
        self.budget = budget_bytes
        self.card_extra = 0  # set by fit: the card less this budget
        self.options = solver_options
        self.progress = progress
        self.graphs: dict[int, Graph] = {}
        self.done: dict[tuple[str, int], tuple[Probe, Plan | None]] = {}
        self.trace_s = 0.0

    def graph(self, size: int) -> Graph:
        if size not in self.graphs:
            t0 = time.perf_counter()
            self.graphs[size] = self.model.graph_at(size)
            dt = time.perf_counter() - t0
            self.trace_s += dt
            log.info("traced %s at %s %d: %d nodes in %.1fs", self.model.name, self.model.dimension, size,
                     len(self.graphs[size]), dt)
        return self.graphs[size]

    def try_size(self, solver: str, size: int, phase: str = "gallop") -> tuple[Probe, Plan | None]:
        key = (solver, size)
        if key not in self.done:
            try:
                graph = self.graph(size)
            except CkptError as exc:
                if not self.graphs:  # not even one size traces: the model's own error
                    raise
                probe, plan = Probe(solver, size, False, phase=phase, stop=f"tracing at {size} failed: {_first(exc)}"), None
            else:
                probe, plan = self._solve(graph, solver, size, phase)
            probe = dataclasses.replace(probe, card_extra_bytes=self.card_extra)
            self.done[key] = (probe, plan)
            log.info("%s at %s %d: %s", solver, self.model.dimension, size, "fits" if probe.fits else "does not fit")
            if self.progress is not None:
                self.progress(probe)
        return self.done[key]

    def _solve(self, graph: Graph, solver: str, size: int, phase: str) -> tuple[Probe, Plan | None]:
        """One solver at one size: a fitting plan, a proven "does not fit", or a stop (NOTE [ One solver's stop ])."""
        if solver == "store-all":  # its peak, also when it does not fit (the report's "needs")
            peak = simulate(graph, None, record=False).peak_bytes
            if peak > self.budget:
                return Probe(solver, size, False, None, None, peak, phase), None
        try:
            plan = solvers.solve(graph, self.budget, solver=solver, **dict(self.options.get(solver, {})))
        except InfeasibleBudget as exc:
            shown = exc.proven or (exc.lower_bound_bytes is not None and exc.lower_bound_bytes > exc.budget_bytes)
            stop = "" if shown else f"no plan found at {size}, and none proven impossible ({_first(exc)})"
            return Probe(solver, size, False, None, None, exc.min_feasible_bytes, phase, stop), None
        except CkptError as exc:
            return Probe(solver, size, False, phase=phase, stop=f"stopped at {size}: {_first(exc)}"), None
        step = graph.total_fwd_flops() + graph.total_bwd_flops()
        ratio = (plan.recompute_flops or 0) / step if step else 0.0
        return Probe(solver, size, True, plan.peak_bytes, ratio, None, phase), plan


def _first(exc: BaseException) -> str:
    """The first clause of an error's one-line message (up to its first "; " outside parentheses)."""
    text, depth = " ".join(str(exc).split()), 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith("; ", i):
            return text[:i]
    return text


def fit_graphs(model: SizedModel, device_memory: int | str, *, optimizer: str | None = "adam", dtype: str = "fp32",
               mixed_precision: bool = False, solver_names: Sequence[str] | None = None, reserve: ReserveSpec = None,
               min_size: int = 1, max_size: int | None = None, multiple_of: int = 1,
               solver_options: Mapping[str, Mapping[str, Any]] | None = None,
               progress: Callable[[Probe], None] | None = None) -> FitResult:
    """Search the largest size of ``model`` that fits ``device_memory``, per solver.

    Args:
        model: the model as ``size -> graph`` (:class:`SizedModel`).
        device_memory: the card (``"24GiB"`` or bytes).
        optimizer, dtype, mixed_precision: the persistent state (``scheduler.sizing.memory``).
        solver_names: solver names (default :data:`DEFAULT_SOLVERS` that are registered).
        reserve: held back from the card (``memory.parse_reserve``).
        min_size, max_size, multiple_of: the sizes searched (``max_size``
            defaults to the model's, else 4096).
        solver_options: per-solver options, e.g. ``{"ilp": {"time_limit_s": 10}}``.
        progress: called with each :class:`Probe` as the search goes.

    Returns:
        A :class:`FitResult`.

    Raises:
        NothingFits: the persistent state alone exceeds the card, or no solver
            fits the smallest size; carries the report and the levers.
        UnknownSolver: a solver name is not registered.
    """
    t0 = time.perf_counter()
    card = parse_size(device_memory) if isinstance(device_memory, str) else int(device_memory)
    names = list(solver_names) if solver_names else [s for s in DEFAULT_SOLVERS if s == "store-all" or s in solvers.available_solvers()]
    for s in names:
        if s != "store-all":
            solvers.get_solver(s)
    hi = max_size or model.max_size or 4096
    if model.max_size:
        hi = min(hi, model.max_size)
    params, trainable = model.params, model.trainable
    first_graph = None
    if params is None:
        first_graph = model.graph_at(max(min_size, multiple_of))
        params = first_graph.param_bytes // dtype_bytes(dtype)
        if trainable is None:  # frozen parameters get no gradient or optimizer state
            trainable = (first_graph.param_bytes - first_graph.frozen_param_bytes) // dtype_bytes(dtype)
    state = persistent_state(params, trainable=trainable, dtype=dtype, optimizer=optimizer,
                             mixed_precision=mixed_precision)
    base = memory_report(state, card, reserve=reserve, size={**model.fixed})
    budget = base.solver_budget_bytes
    check_state_fits(base)
    trials = _Trials(model, budget, solver_options or {}, progress)
    trials.card_extra = base.device_bytes - budget
    if first_graph is not None:
        trials.graphs[max(min_size, multiple_of)] = first_graph
    results = []
    for name in names:
        size, capped = search_largest(lambda s, ph: trials.try_size(name, s, ph)[0].fits, min_size, hi,
                                      multiple_of=multiple_of)
        probes = tuple(p for (sv, _), (p, _) in trials.done.items() if sv == name)
        failed = [p for p in probes if not p.fits]  # the smallest failure decides (NOTE [ Size search ])
        stop = min(failed, key=lambda p: p.size).stop if failed else ""
        if size is None:
            results.append(SolverFit(name, None, probes=probes, stop=stop))
            continue
        probe, plan = trials.try_size(name, size)
        results.append(SolverFit(name, size, probe.peak_bytes, probe.recompute_ratio, plan, capped, probes, stop))
        log.info("%s: largest %s %d (peak %d bytes, recompute %.1f%%)", name, model.dimension, size,
                 probe.peak_bytes or 0, 100 * (probe.recompute_ratio or 0))
    best = max((r.size for r in results if r.size is not None), default=None)
    at = best if best is not None else max(min_size, multiple_of)
    report = _report_at(trials, names, at, state, card, reserve, model)
    if best is None:
        raise NothingFits(
            f"nothing fits: at the smallest {model.dimension} ({at}) no solver finds a plan within the "
            f"{format_bytes(budget)} the card leaves after optimizer state, master weights and reserve.", report, levers(report))
    target = dict(trials.graph(at).meta.get("target") or {})
    return FitResult(model.dimension, dict(model.fixed), tuple(results), report, len(trials.graphs),
                     time.perf_counter() - t0, target)


def _report_at(trials: _Trials, names: Sequence[str], size: int, state: PersistentState, card: int,
               reserve: ReserveSpec, model: SizedModel) -> MemoryReport:
    graph = trials.graph(size)
    rows = []
    for name in names:
        probe, plan = trials.try_size(name, size, "report")
        if plan is None:
            rows.append(PlanMemory(name, None, None, None, False, probe.min_feasible_bytes, bool(probe.stop)))
        else:
            sim = simulate(graph, plan, record=False)
            rows.append(plan_memory(name, sim, state.grad_bytes, trials.budget))
    return memory_report(state, card, reserve=reserve, input_bytes=graph.input_bytes, plans=rows,
                         size={**model.fixed, model.dimension: size})
