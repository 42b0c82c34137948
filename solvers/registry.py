"""One call for every solver: ``solve(graph, budget_bytes, solver=NAME, **options)``.

NOTE [ Solver contract ]
    A solver is a function ``fn(graph, budget_bytes, **options) -> Plan``.
    It returns a plan whose regions it believes fit, with ``status``
    (``optimal`` or ``feasible``) and, when it knows them, ``bound`` and
    ``gap``, and in ``findings`` what it found (method used, work done); or
    raises :class:`~solvers.errors.InfeasibleBudget` carrying the least budget
    for which it *would* find a plan. :func:`solve` checks the options first
    (NOTE [ Solver options ] in ``solvers.options``), then costs every plan
    the same way, with :func:`~solvers.model.simulate.simulate` (the one cost
    model): it fills ``peak_bytes``, ``recompute_flops``, ``recompute_cost``,
    ``recompute_time_s``, the budget, the
    fingerprint, the solve time and ``options`` (as the caller asked them;
    never what the solver found), and refuses a plan that does not fit.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from graphs import Graph

from .errors import InfeasibleBudget, PlanError, SolverOptionError, UnknownOption, UnknownSolver
from .options import Option, check_all, describe
from .model.plan import Plan
from .merge import fewer_regions
from .model.overheads import with_extra_time
from .model.simulate import simulate

__all__ = ["SolverFn", "SolverInfo", "register", "get_solver", "solver_info", "available_solvers", "exact_solvers",
           "solve", "finalize", "solver_options", "check_options"]

log = logging.getLogger(__name__)

SolverFn = Callable[..., Plan]


@dataclass(frozen=True)
class SolverInfo:
    """A registered solver.

    Attributes:
        name: its registry name.
        fn: the function (NOTE [ Solver contract ]).
        options: its options (NOTE [ Solver options ] in ``solvers.options``), defaults filled in.
        exact: its plans are proven optimal over every interval plan, and its
            least feasible budget is over every interval plan (the others' is
            over their own plans: NOTE [ No unproven floor ]).
        part_of: the solver this one is a method of (``frontier`` and
            ``cp-sat`` are ``ilp``'s), listed only by ``available_solvers(methods=True)``.
    """

    name: str
    fn: SolverFn
    options: tuple[Option, ...] = ()
    exact: bool = False
    part_of: str | None = None

    @property
    def summary(self) -> str:
        """The first line of the solver's docstring."""
        return (inspect.getdoc(self.fn) or "").split("\n")[0]


_REGISTRY: dict[str, SolverInfo] = {}


def _declared(name: str, fn: SolverFn, options: tuple[Option, ...]) -> tuple[Option, ...]:
    """``options`` with their defaults read from ``fn``'s signature; refuses a mismatch (a bug in the solver)."""
    params = {p.name: p for i, p in enumerate(inspect.signature(fn).parameters.values())
              if i >= 2 and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    catch_all = [p.name for p in inspect.signature(fn).parameters.values() if p.kind == p.VAR_KEYWORD]
    names = [o.name for o in options]
    if catch_all or set(params) != set(names) or len(names) != len(set(names)):
        raise SolverOptionError(
            f"solver {name} declares options {names} but its function takes {list(params)}"
            + (f" and **{catch_all[0]}" if catch_all else "")
            + "; declare every keyword parameter once as an Option in register() (NOTE [ Solver options ])")
    return tuple(o.with_default(params[o.name].default) for o in options)


def register(name: str, *, options: tuple[Option, ...] = (), exact: bool = False,
             part_of: str | None = None) -> Callable[[SolverFn], SolverFn]:
    """Decorator: make ``fn`` available as ``solve(..., solver=name)``.

    Args:
        name: the registry name.
        options: every keyword option ``fn`` takes (NOTE [ Solver options ]).
        exact: see :class:`SolverInfo`.
        part_of: see :class:`SolverInfo`.

    Raises:
        SolverOptionError: ``options`` and ``fn``'s signature disagree.
    """

    def deco(fn: SolverFn) -> SolverFn:
        _REGISTRY[name] = SolverInfo(name, fn, _declared(name, fn, tuple(options)), exact, part_of)
        return fn

    return deco


def available_solvers(*, methods: bool = False) -> list[str]:
    """Registered solver names, in registration order.

    Args:
        methods: also the solvers that are one method of another
            (``frontier`` and ``cp-sat``, which ``ilp`` runs): for test
            batteries and ``ckpt solve --solver NAME``; ``--solver all`` and
            comparisons leave them out (``ilp`` already runs them).
    """
    return [n for n, info in _REGISTRY.items() if methods or info.part_of is None]


def exact_solvers() -> list[str]:
    """The registered solvers whose plans are proven optimal over every interval plan."""
    return [n for n, info in _REGISTRY.items() if info.exact]


def solver_info(name: str) -> SolverInfo:
    """The registration of ``name``.

    Raises:
        UnknownSolver: naming the registered solvers.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownSolver(f"unknown solver {name!r}; available: {', '.join(available_solvers(methods=True))}") from None


def get_solver(name: str) -> SolverFn:
    """The solver registered as ``name``.

    Raises:
        UnknownSolver: naming the registered solvers.
    """
    return solver_info(name).fn


def solver_options(fn: SolverFn) -> list[str] | None:
    """The keyword options ``fn`` takes, or None when it takes any (``**options``).

    For a registered solver, its declared options; otherwise read from the
    signature, where a catch-all named ``_`` (``**_``) means "ignored", not
    "taken": only the named options count.
    """
    for info in _REGISTRY.values():
        if info.fn is fn:
            return [o.name for o in info.options]
    names = []
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        if p.kind == p.VAR_KEYWORD:
            if p.name != "_":
                return None
        elif i >= 2 and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return names


def check_options(fn: SolverFn, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options checked against what the solver declares (NOTE [ Solver options ]).

    A registered solver's options are checked by name, type and range; a
    function passed directly only by name (from its signature).

    Returns:
        The options, values as checked (an ``int`` given for a ``float`` option becomes a float).

    Raises:
        UnknownOption: an option the solver does not take (naming those it does, with types).
        SolverOptionError: a value of the wrong type or out of range.
    """
    info = _REGISTRY.get(name)
    if info is not None and info.fn is fn:
        return check_all(name, info.options, dict(options))
    takes = solver_options(fn)
    if takes is None:
        return dict(options)
    stray = sorted(set(options) - set(takes))
    if stray:
        raise UnknownOption(f"solver {name} takes no option {', '.join(map(repr, stray))}; "
                            f"it takes {', '.join(takes) if takes else 'no options'}")
    return dict(options)


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
        options={k: v for k, v in options.items() if isinstance(v, (int, float, str, bool, type(None)))},
        findings=with_extra_time(plan.findings, sim),
        budget_bytes=int(budget_bytes),
        peak_bytes=sim.peak_bytes,
        recompute_flops=sim.recompute_flops,
        recompute_cost=sim.recompute_cost,
        recompute_time_s=sim.recompute_time_s,
        gap=gap,
        solve_time_s=elapsed,
        graph_name=graph.name,
        graph_meta=graph.meta,
        loop=graph.loop if graph.outputs else "",
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
        SolverOptionError: an option of the wrong type or out of range.
    """
    fn = get_solver(solver) if isinstance(solver, str) else solver
    name = solver if isinstance(solver, str) else getattr(solver, "__name__", "custom")
    options = check_options(fn, name, options)
    t0 = time.perf_counter()
    try:
        plan = fn(graph, int(budget_bytes), **options)
    except InfeasibleBudget as exc:
        if name in exact_solvers() or exc.scope or not exc.proven:
            raise
        # NOTE [ No unproven floor ]: a heuristic's least is over its own plans only.
        raise exc.replace(scope=f"the plans {name} considers (ilp searches every interval plan)") from None
    plan.validate(graph)
    stray = plan.unaligned_regions(graph)
    if stray:
        raise PlanError(f"solver {name} returned region(s) {stray[:3]} that are no submodule call of the graph "
                        "(NOTE [ Module-aligned regions ]); solve on graph.unaligned() for the graph-level applier")
    plan = fewer_regions(graph, plan, budget_bytes)  # NOTE [ Merging regions for their overhead ]
    out = finalize(graph, plan, budget_bytes, name, options, t0)
    if out.peak_bytes > budget_bytes:
        log.warning("solver %s returned a plan over budget (%d > %d)", name, out.peak_bytes, budget_bytes)
        raise InfeasibleBudget(budget_bytes, out.peak_bytes, solver=name, best_regions=out.regions, proven=False)
    log.info("%s: %d regions, peak %d / budget %d, recompute %d FLOPs in %.3fs",
             name, len(out.regions), out.peak_bytes, budget_bytes, out.recompute_flops, out.solve_time_s)
    return out
