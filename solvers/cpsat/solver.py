"""Running the CP-SAT model of ``ilp`` (NOTE [ An exact model of simulate ] in ``solvers.ilp``): its warm start,
the search, the answer checked (:func:`solve_within`). ``ilp`` and ``cp-sat`` (both registered in ``solvers.ilp``)
build on it.

OR-Tools is imported only here, when a search runs (:func:`checkpoint_model`):
``import solvers``, ``ckpt --help`` and an ``ilp`` answered by the frontier
program never load it (with pandas it pulls in, 2.3 s of a 3.25 s import).

NOTE [ Deterministic CP-SAT ]
    The same graph and budget give the same plan on a busy machine:
    ``time_limit_s`` is only a safety net. CP-SAT is stopped by a
    deterministic work limit (``work_limit``: its ``max_deterministic_time``,
    about seconds of one idle core), its workers are interleaved in one
    deterministic schedule (``interleave_search``) with a fixed
    ``random_seed``, and completing the warm-start hint has a work limit too.
    Stopped by the clock instead, a search's answer depended on the load: a
    timm ResNet-50 at 0.5 came back at +23.3 % recompute (gap 88 %) on a
    loaded machine where the optimum is +3.0 %. When the clock does stop it
    first, the plan says so (``findings["cp_sat_stopped_by"] == "time limit"``).
    ``tests/solvers/test_solver_options.py::test_work_limit_gives_the_same_plan_twice``
    guards it.
"""

from __future__ import annotations

import gc
import logging
import math
import sys
from typing import Any, Sequence

from graphs import CkptError, Graph

from ..deadline import Deadline, OutOfTime
from ..errors import InfeasibleBudget, MissingDependency, SolverBug
from ..options import Option
from ..model.plan import Plan, Status
from ..model.simulate import simulate
from ..warm import Incumbent, simple_peaks, warm_starts

__all__ = ["IlpTimeout", "IlpSolver", "Incumbent", "WARM_SOLVERS", "CP_SAT_OPTIONS", "DEFAULT_WORK_LIMIT",
           "checkpoint_model", "warm_start", "solve_within"]

log = logging.getLogger(__name__)

#: CP-SAT's default deterministic work limit (``work_limit``).
DEFAULT_WORK_LIMIT = 30.0
#: The options CP-SAT runs take (``cp-sat`` all of them; ``ilp`` adds its own).
CP_SAT_OPTIONS = (
    Option("time_limit_s", float, "wall clock: the call returns within this + 1 s with the best plan "
           "found (NOTE [ One deadline ])", minimum=0),
    Option("work_limit", float, "the work each search may do, counted (about seconds of one idle core): CP-SAT's "
           "deterministic time, the frontier program's work, dp's table in the warm start; the same graph and budget "
           "give the same plan on a busy machine where they end within it; None: the wall clock only", above=0,
           none_ok=True),
    Option("workers", int, "CP-SAT search workers (interleaved deterministically under a work limit)", minimum=1),
    Option("seed", int, "CP-SAT's random seed", minimum=0),
    Option("gap_limit", float, "stop once the proven relative gap is at most this (0: prove optimality)",
           minimum=0, maximum=1),
    Option("warm_start", bool, "start from the cheapest fitting plan of dp, chen, uniform and per-module"),
)


class IlpTimeout(CkptError, RuntimeError):
    """CP-SAT found no plan (and none was given as a hint) within the time limit."""


#: Seconds importing OR-Tools takes (with pandas, which it pulls in) where it is not imported yet, and the least
#: a search is worth starting with (NOTE [ One deadline ]).
IMPORT_S = 1.5
MIN_SEARCH_S = 0.2


def cp_sat_may_start(deadline: Deadline, nodes: int) -> bool:
    """Whether a CP-SAT search is worth starting with what ``deadline`` leaves: its least search time and the
    read-out, and importing OR-Tools where it is not imported yet (1.5 s of a 1 s limit, otherwise)."""
    need = MIN_SEARCH_S + deadline.read_out_s(nodes) + (0.0 if "ortools.sat.python.cp_model" in sys.modules
                                                         else IMPORT_S)
    return deadline.left() >= need


def checkpoint_model() -> Any:
    """``solvers.cpsat.model.CheckpointModel``, importing OR-Tools now.

    Raises:
        MissingDependency: OR-Tools is not installed (the message says ``pip install ortools``).
    """
    try:
        from .model import CheckpointModel
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "ortools":
            raise
        raise MissingDependency(
            "the CP-SAT model (solver 'cp-sat', and 'ilp' on graphs the frontier program does not take) needs "
            "OR-Tools, which is not installed: pip install ortools (or use solver 'frontier', 'dp' or 'chen')"
        ) from None
    return CheckpointModel


#: A model that took at least this many seconds to build is collected (``gc.collect``) once its search is over
#: (:func:`collect_after`).
COLLECT_AFTER_BUILD_S = 1.0


def collect_after(built_s: float) -> None:
    """Once the last reference to a model that took ``built_s`` seconds to build is gone: where that was long,
    collect its cycles now, in the time its search kept back for that (NOTE [ What follows a search ] in
    ``solvers.cpsat.model``), not at some allocation past the deadline (0.7 s for a 20,000-node chain's
    model, in the command's output)."""
    if built_s >= COLLECT_AFTER_BUILD_S:
        gc.collect()


class IlpSolver:
    """Build, solve and read out the CP-SAT model of one graph and budget.

    Args:
        graph: the cost graph.
        budget_bytes: whole-step budget.
        time_limit_s: wall-clock limit, when no ``deadline`` is given.
        deadline: the deadline of the whole solve (NOTE [ One deadline ]).
        work_limit: CP-SAT's deterministic work limit (NOTE [ Deterministic CP-SAT ]).
        workers: CP-SAT search workers.
        seed: CP-SAT's random seed.
        gap_limit: stop once the relative gap is at most this (0: prove optimality).
        hint: a plan (regions) to warm-start from.
        lower_bound: a proven lower bound on the recompute cost (``dp``'s
            optimum on a chain), added as a constraint to close the gap.
        incumbent: a plan known to fit; it hints the search, caps the
            objective, and is returned when CP-SAT finds nothing better.
        tried: the fast solvers that ran and found no plan under the budget
            (:func:`warm_start`), so that a stop never advises them; None: none ran.
    """

    def __init__(self, graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0,
                 deadline: Deadline | None = None, work_limit: float | None = DEFAULT_WORK_LIMIT, workers: int = 2,
                 seed: int = 0, gap_limit: float = 0.0, hint: tuple[tuple[int, int], ...] | None = None,
                 lower_bound: int | None = None, incumbent: Incumbent | None = None,
                 tried: Sequence[str] | None = None) -> None:
        self.graph = graph
        self.tried = tried
        self.budget_bytes = int(budget_bytes)
        self.deadline = deadline if deadline is not None else Deadline(time_limit_s)
        self.time_limit_s = self.deadline.limit_s
        self.work_limit = work_limit
        self.workers = workers
        self.seed = seed
        self.gap_limit = float(gap_limit)
        self.incumbent = incumbent
        self.hint = hint if hint is not None or incumbent is None else incumbent.regions
        self.lower_bound = lower_bound
        self.findings: dict[str, Any] = {"method": "cp-sat"}

    def _plan(self, regions, status: str, bound: float | None) -> Plan:
        return Plan(regions=regions, status=status, bound=bound, findings=self.findings)

    def _from_incumbent(self, bound: float | None, why: str) -> Plan:
        inc = self.incumbent
        if inc is None:
            raise SolverBug("ilp: no incumbent to return")
        lb = max(float(bound) if bound is not None and bound == bound else 0.0, float(self.lower_bound or 0))
        lb = min(lb, float(inc.flops))
        log.info("ilp returns the %s plan (%s): %d FLOPs, bound %.6g", inc.source, why, inc.flops, lb)
        self.findings["incumbent"] = inc.source
        return self._plan(inc.regions, Status.OPTIMAL if lb >= inc.flops else Status.FEASIBLE, lb)

    def _cp_sat_left(self) -> float:
        return self.deadline.left() - self.deadline.read_out_s(len(self.graph))

    def _record(self, result: Any) -> None:
        self.findings["cp_sat_status"] = result.status
        self.findings["cp_sat_work"] = round(self.findings.get("cp_sat_work", 0.0) + result.work, 3)
        hit_work = self.work_limit is not None and result.work >= 0.99 * self.work_limit
        if result.status in ("feasible", "unknown"):
            self.findings["cp_sat_stopped_by"] = "work limit" if hit_work else "time limit"

    def _out_of_time(self, bound: float | None = None) -> Plan:
        """The answer when the deadline passed before CP-SAT could (go on) run(ning)."""
        self.findings["cp_sat_stopped_by"] = "time limit"
        if self.incumbent is not None:
            return self._from_incumbent(bound, "time limit")
        if self.hint is not None and simulate(self.graph, Plan(regions=self.hint), record=False).peak_bytes <= self.budget_bytes:
            return self._plan(self.hint, Status.FEASIBLE, bound)
        raise IlpTimeout(
            f"no plan found within {self.time_limit_s:.3g} s for this graph ({len(self.graph)} nodes; not "
            f"proven infeasible); raise time_limit_s (--time-limit){fast_advice(self.tried)}")

    def solve(self) -> Plan:
        """Solve; a plan with status ``optimal`` or ``feasible`` (bound and gap).

        Never worse than :attr:`incumbent` when one is given.

        Raises:
            InfeasibleBudget: no interval plan fits; carries the least peak.
            IlpTimeout: no plan found within the time limit (and no incumbent).
            MissingDependency: OR-Tools is not installed.
        """
        cuts: list[tuple[tuple[int, int], ...]] = []
        inc = self.incumbent
        for _ in range(50):
            if not cp_sat_may_start(self.deadline, len(self.graph)):
                return self._out_of_time()
            model_class = checkpoint_model()  # OR-Tools loads here, not when there is no time to search
            # Phases: variables, constraints, objective (CheckpointModel), then solve.
            try:
                model = model_class(self.graph, budget_bytes=self.budget_bytes, deadline=self.deadline)
            except (OutOfTime, MemoryError) as exc:
                log.info("ilp: CP-SAT's model not built (%s)", exc or "out of memory")
                built = False
            else:
                built = True
            if not built:  # free the half-built model's cycles now, within the limit, not at the process's exit
                gc.collect()
                return self._out_of_time()
            for bad in cuts:
                model.forbid(bad)
            if self.hint is not None and self.hint not in cuts:
                left = model.search_left()  # NOTE [ What follows a search ] in solvers.cpsat.model
                model.add_hint(self.hint, complete_s=max(0.0, min(30.0, 0.1 * left)),
                               complete_work=None if self.work_limit is None else min(30.0, 0.1 * self.work_limit))
            if self.lower_bound is not None:
                model.add_lower_bound(self.lower_bound)
            if inc is not None:
                model.add_upper_bound(inc.flops)
            knap = model.add_memory_cuts(self.budget_bytes)
            if knap > (self.lower_bound or 0):
                log.info("ilp knapsack bound %d FLOPs", knap)
                self.lower_bound = knap
                model.add_lower_bound(knap)
            if model.search_left() <= 0:
                built_s, model = model.build_s, None
                collect_after(built_s)
                return self._out_of_time()
            result = model.solve(time_limit_s=model.search_left(), workers=self.workers, gap_limit=self.gap_limit,
                                 work_limit=self.work_limit, seed=self.seed)
            self._record(result)
            built_s, model = model.build_s, None  # freed within the limit (NOTE [ What follows a search ])
            collect_after(built_s)
            if result.status == "infeasible":
                if inc is not None:
                    # The incumbent itself satisfies the model (it is exact), so this is a model bug.
                    log.error("ilp model rejects the %s plan that simulate says fits", inc.source)
                    return self._from_incumbent(None, "model rejects it")
                least, regions, lower = self.least_peak()
                lower = max(lower, self.budget_bytes + 1)  # the budget itself is proven too small
                raise InfeasibleBudget(self.budget_bytes, least, solver="ilp", best_regions=regions,
                                       proven=least <= lower, lower_bound_bytes=lower,
                                       time_limit_s=None if least <= lower else self.time_limit_s,
                                       stopped_by="" if least <= lower else self._least_stop)
            if result.regions is None:
                return self._out_of_time(result.bound)
            sim = simulate(self.graph, Plan(regions=result.regions), record=False)
            if sim.peak_bytes <= self.budget_bytes:
                optimal = result.status == "optimal"
                bound = float(sim.recompute_cost) if optimal else float(result.bound)
                if inc is not None and inc.flops <= sim.recompute_cost:
                    # Ties go to the incumbent: CP-SAT's equal-cost plan may add free regions.
                    return self._from_incumbent(bound, "no cheaper plan found")
                return self._plan(result.regions, Status.OPTIMAL if optimal else Status.FEASIBLE, bound)
            log.error("ilp model predicted a fit for %s but simulate says %d > %d; cutting it off",
                      result.regions, sim.peak_bytes, self.budget_bytes)
            cuts.append(result.regions)
        if inc is not None:
            return self._from_incumbent(None, "model and simulate disagree")
        raise SolverBug("ilp model and simulate disagree repeatedly; please report this graph")

    def least_peak(self) -> tuple[int, tuple[tuple[int, int], ...], int]:
        """The lowest simulated peak found over all interval plans, a plan
        that reaches it, and CP-SAT's proven lower bound on the least peak
        (the two meet when it is proven; NOTE [ No unproven floor ]), within the deadline."""
        peaks = simple_peaks(self.graph)
        bound = 0.0
        result = None
        self._least_stop = ""  # the time limit, unless CP-SAT's work limit stopped it (named then)
        if self._cp_sat_left() > 0:
            try:
                model = checkpoint_model()(self.graph, budget_bytes=None, deadline=self.deadline)
                result = model.solve(time_limit_s=max(0.01, model.search_left()), workers=self.workers,
                                     work_limit=self.work_limit, seed=self.seed)
                built_s, model = model.build_s, None
                collect_after(built_s)
            except OutOfTime as exc:
                log.info("ilp least peak: %s", exc)
        if result is not None:
            if result.regions is not None:
                peaks.append((simulate(self.graph, Plan(regions=result.regions), record=False).peak_bytes,
                              result.regions))
            # The model minimises the activations' peak; the whole step's adds the parameters and inputs (issue
            # 33: without them a proven least peak was 'not proven', DenseNet's by exactly its 27.43 MiB).
            const = self.graph.param_bytes + self.graph.input_bytes
            bound = result.bound + const if result.bound == result.bound else 0.0  # NaN when CP-SAT has none
            if result.status != "optimal" and self.work_limit is not None and result.work >= 0.99 * self.work_limit:
                self._least_stop = (f"CP-SAT's work limit ({self.work_limit:g} deterministic s) after "
                                    f"{self.deadline.elapsed():.1f} s of the {self.time_limit_s:g} s time limit")
        least, regions = min(peaks, key=lambda p: p[0])
        return least, regions, min(least, int(math.ceil(bound - 1e-6)))


#: The fast solvers whose best fitting plan warm-starts ``ilp`` (NOTE [ Bounded warm starts ] in ``solvers.warm``).
WARM_SOLVERS = ("store-all", "per-module", "chen", "dp", "uniform")


def fast_advice(tried: Sequence[str] | None) -> str:
    """``, or use solver 'dp' or 'chen'``, naming only those not already run without a plan (``tried``; None:
    none ran): a stop never advises a solver that has just found nothing under the same budget."""
    untried = [n for n in ("dp", "chen") if tried is None or n not in tried]
    if untried:
        return ", or use solver " + " or ".join(repr(n) for n in untried)
    return f" ({', '.join(tried or ())} found no plan under this budget either)"


def warm_start(graph: Graph, budget_bytes: int, deadline: Deadline | None = None, tried: list[str] | None = None, *,
               work_limit: float | None = DEFAULT_WORK_LIMIT) -> tuple[Incumbent | None, int | None]:
    """The cheapest fitting plan without kept nodes of the fast solvers (per ``simulate``), and a
    proven lower bound on the cost when ``dp`` is optimal (on chains), within ``deadline`` and the
    work limit (NOTE [ Bounded warm starts ] in ``solvers.warm``). ``tried`` gets the name of each
    solver that ran and found no fitting plan."""
    warm = warm_starts(graph, budget_bytes, deadline, work_limit=work_limit, selective=False)
    if tried is not None:
        tried.extend(warm.tried)
    return warm.plain, warm.bound


def solve_within(graph: Graph, budget_bytes: int, deadline: Deadline, *, work_limit: float | None = DEFAULT_WORK_LIMIT,
                 workers: int = 2, seed: int = 0, gap_limit: float = 0.0, warm_start_: bool = True,
                 incumbent: Incumbent | None = None, bound: int | None = None,
                 tried: Sequence[str] | None = None) -> Plan:
    """``cp-sat`` without kept nodes against a given deadline (the solver's body; tests pass a fake clock).

    Args:
        incumbent, bound, tried: a plan that fits, a proven lower bound and the fast solvers that found no plan,
            already known (no warm start is run then).
    """
    inc = incumbent
    if inc is None and warm_start_:
        found: list[str] = []
        inc, bound = warm_start(graph, budget_bytes, deadline, found, work_limit=work_limit)
        tried = found
    if inc is not None and (inc.flops == 0 or (bound is not None and inc.flops <= bound)):
        return Plan(regions=inc.regions, status=Status.OPTIMAL, bound=float(inc.flops),
                    findings={"method": "warm start", "incumbent": inc.source})
    solver = IlpSolver(graph, budget_bytes, deadline=deadline, work_limit=work_limit, workers=workers, seed=seed,
                       gap_limit=gap_limit, lower_bound=bound, incumbent=inc, tried=tried)
    try:
        return solver.solve()
    except InfeasibleBudget as exc:
        if exc.proven:
            raise
        raise exc.replace(time_limit_s=deadline.limit_s) from None  # the limit the caller gave
