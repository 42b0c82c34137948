"""One call for every solver: ``solve(graph, budget_bytes, solver=NAME, **options)``.

NOTE [ Solver contract ]
    A solver is a function ``fn(graph, budget_bytes, **options) -> Plan``.
    It returns a plan whose regions it believes fit, with ``status``
    (``optimal`` or ``feasible``) and, when it knows them, ``bound`` and
    ``gap``; or raises :class:`~solvers.errors.InfeasibleBudget` carrying the
    least budget for which it *would* find a plan. :func:`solve` then costs
    every plan the same way, with :func:`~solvers.simulate.simulate` (the one
    cost model): it fills ``peak_bytes``, ``recompute_flops``, ``recompute_cost``,
    ``recompute_time_s``, the budget, the
    fingerprint and the solve time, and refuses a plan that does not fit.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from typing import Any, Callable

from graphs import Graph

from .errors import InfeasibleBudget, PlanError, UnknownOption, UnknownSolver
from .plan import Plan
from .simulate import simulate

__all__ = ["SolverFn", "register", "get_solver", "available_solvers", "solve", "finalize", "solver_options",
           "check_options"]

log = logging.getLogger(__name__)

SolverFn = Callable[..., Plan]
#: Solvers whose least feasible budget is over every interval plan (the others' is over their own plans).
EXACT_SOLVERS = ("ilp",)
_REGISTRY: dict[str, SolverFn] = {}


def register(name: str) -> Callable[[SolverFn], SolverFn]:
    """Decorator: make ``fn`` available as ``solve(..., solver=name)``."""

    def deco(fn: SolverFn) -> SolverFn:
        _REGISTRY[name] = fn
        return fn

    return deco


def available_solvers() -> list[str]:
    """Registered solver names, in registration order."""
    return list(_REGISTRY)


def get_solver(name: str) -> SolverFn:
    """The solver registered as ``name``.

    Raises:
        UnknownSolver: naming the registered solvers.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownSolver(f"unknown solver {name!r}; available: {', '.join(available_solvers())}") from None


def solver_options(fn: SolverFn) -> list[str] | None:
    """The keyword options ``fn`` takes, or None when it takes any (``**options``).

    A catch-all named ``_`` (``**_``) means "ignored", not "taken": only the
    named options count.
    """
    names = []
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        if p.kind == p.VAR_KEYWORD:
            if p.name != "_":
                return None
        elif i >= 2 and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return names


def check_options(fn: SolverFn, name: str, options: dict[str, Any]) -> None:
    """Refuse options the solver does not take (they were silently ignored before).

    Raises:
        UnknownOption: naming the options the solver takes.
    """
    takes = solver_options(fn)
    if takes is None:
        return
    stray = sorted(set(options) - set(takes))
    if stray:
        raise UnknownOption(f"solver {name} takes no option {', '.join(map(repr, stray))}; "
                            f"it takes {', '.join(takes) if takes else 'no options'}")


def finalize(graph: Graph, plan: Plan, budget_bytes: int, solver: str, options: dict[str, Any], t0: float) -> Plan:
    """Cost ``plan`` with ``simulate`` and stamp it (the shared lowering path)."""
    sim = simulate(graph, plan, record=False)
    elapsed = time.perf_counter() - t0
    gap = plan.gap
    if plan.bound is not None and gap is None:
        gap = max(0.0, (sim.recompute_cost - plan.bound) / max(sim.recompute_cost, 1))
    return dataclasses.replace(
        plan.labelled(graph),
        fingerprint=graph.fingerprint(),
        solver=solver,
        options={**plan.options, **{k: v for k, v in options.items() if isinstance(v, (int, float, str, bool, type(None)))}},
        budget_bytes=int(budget_bytes),
        peak_bytes=sim.peak_bytes,
        recompute_flops=sim.recompute_flops,
        recompute_cost=sim.recompute_cost,
        recompute_time_s=sim.recompute_time_s,
        gap=gap,
        solve_time_s=elapsed,
        graph_name=graph.name,
        graph_meta=graph.meta,
    )


def solve(graph: Graph, budget_bytes: int, solver: str | SolverFn = "dp", **options: Any) -> Plan:
    """Choose checkpoint regions for ``graph`` under ``budget_bytes``.

    Args:
        graph: the cost graph.
        budget_bytes: whole-step budget, compared with ``simulate``'s peak.
        solver: a registered name (see :func:`available_solvers`) or a
            function obeying NOTE [ Solver contract ].
        **options: passed to the solver.

    Returns:
        The plan, costed by ``simulate``.

    Raises:
        InfeasibleBudget: no plan the solver considers fits.
        UnknownSolver: no such solver.
        UnknownOption: an option the solver does not take.
    """
    fn = get_solver(solver) if isinstance(solver, str) else solver
    name = solver if isinstance(solver, str) else getattr(solver, "__name__", "custom")
    check_options(fn, name, options)
    t0 = time.perf_counter()
    try:
        plan = fn(graph, int(budget_bytes), **options)
    except InfeasibleBudget as exc:
        if name in EXACT_SOLVERS or exc.scope or not exc.proven:
            raise
        # NOTE [ No unproven floor ]: a heuristic's least is over its own plans only.
        raise exc.replace(scope=f"the plans {name} considers (ilp searches every interval plan)") from None
    plan.validate(graph)
    stray = plan.unaligned_regions(graph)
    if stray:
        raise PlanError(f"solver {name} returned region(s) {stray[:3]} that are no submodule call of the graph "
                        "(NOTE [ Module-aligned regions ]); solve on graph.unaligned() for the graph-level applier")
    out = finalize(graph, plan, budget_bytes, name, options, t0)
    if out.peak_bytes > budget_bytes:
        log.warning("solver %s returned a plan over budget (%d > %d)", name, out.peak_bytes, budget_bytes)
        raise InfeasibleBudget(budget_bytes, out.peak_bytes, solver=name, best_regions=out.regions, proven=False)
    log.info("%s: %d regions, peak %d / budget %d, recompute %d FLOPs in %.3fs",
             name, len(out.regions), out.peak_bytes, budget_bytes, out.recompute_flops, out.solve_time_s)
    return out
