"""Errors raised by plans and solvers. All derive from :class:`graphs.CkptError`."""

from __future__ import annotations

from graphs import CkptError

__all__ = ["CkptError", "PlanError", "PlanMismatch", "InfeasibleBudget", "UnknownSolver", "SolverOptionError",
           "UnknownOption", "SolverInputError", "MissingDependency", "SolverBug", "format_bytes"]


class PlanError(CkptError, ValueError):
    """A plan is malformed (overlapping regions, index out of range, bad JSON)."""


class PlanMismatch(PlanError):
    """A plan was solved for a different graph (model, input shape or dtype)."""


class UnknownSolver(CkptError, KeyError):
    """No solver is registered under the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want a sentence.
        return str(self.args[0]) if self.args else ""


class SolverOptionError(CkptError, ValueError):
    """A solver option is unknown, of the wrong type or out of range.

    The message names the solver's options with their types (NOTE [ Solver
    options ] in ``solvers.options``).
    """


class UnknownOption(SolverOptionError, TypeError):
    """A solver was given an option it does not take (the message names those it does)."""


class SolverInputError(CkptError, ValueError):
    """An argument of a solver-side function is outside its domain (a graph too large for brute
    force, a budget fraction outside (0, 1], a region that is no interval of the graph)."""


class MissingDependency(CkptError, ImportError):
    """An optional library a solver needs is not installed (the message says what to install)."""


class SolverBug(CkptError, RuntimeError):
    """A solver broke one of its own invariants: a bug to report, never the user's input."""


class InfeasibleBudget(CkptError, ValueError):
    """No plan fits the budget, or none was found in the time allowed.

    NOTE [ No unproven floor ]
        "The least feasible budget is X" is said only when X is proven: the
        least peak over every plan the solver considers. A search cut short
        by a time limit (CP-SAT's ``unknown`` status, the frontier program's
        timeout) knows less: a plan it found peaks at some X, and the least
        feasible budget lies between a proven lower bound and X. Such an
        error has ``proven=False`` and says "no plan found within N s", with
        the plan it found and the best proven lower bound, each labelled
        (a 60-node random DAG once got four different "least feasible
        budgets" from four short runs, none of them the true one).

    Attributes:
        budget_bytes: the budget that was asked for.
        min_feasible_bytes: the least peak of the plans the solver found: the
            least feasible budget when ``proven``, else a budget a plan is
            known to meet (an upper bound on the least).
        floor: optional explanation of what sets that minimum (which step and
            node), as a sentence.
        best_regions: the regions of the plan that peaks at
            ``min_feasible_bytes``, when the solver has it (``()`` is
            store-all); None when unknown.
        proven: whether ``min_feasible_bytes`` is proven least.
        best_inner, best_saved: that plan's inner regions and kept nodes (a
            nested or selective plan), so that what explains its peak is the
            plan itself: one floor per message (issue 33: "least feasible
            48.83 MiB" beside "the lowest plan found peaks at 55.85 MiB", the
            same plan without its inner regions).
        lower_bound_bytes: a proven lower bound on the least feasible budget
            (``budget_bytes + 1`` when only the budget is proven too small;
            None when not even that is known).
        time_limit_s: the time limit that cut the search short, if one did.
        stopped_by: what cut it short when that was not the time limit (a
            work limit: "CP-SAT's work limit (...) after 6.1 s of the 60 s
            time limit"); the message names it instead of the time limit
            (issue 33: "not proven within 60 s" after 6 s).
        scope: the plans the minimum is over when not every interval plan
            (``"the plans dp considers (ilp searches every interval plan)"``);
            "" for every interval plan.
    """

    def __init__(self, budget_bytes: int, min_feasible_bytes: int, *, solver: str = "", floor: str = "",
                 best_regions: tuple[tuple[int, int], ...] | None = None, proven: bool = True,
                 lower_bound_bytes: int | None = None, time_limit_s: float | None = None, scope: str = "",
                 best_inner: tuple[tuple[int, int], ...] = (), best_saved: tuple[int, ...] = (),
                 stopped_by: str = "") -> None:
        self.budget_bytes = int(budget_bytes)
        self.min_feasible_bytes = int(min_feasible_bytes)
        self.solver = solver
        self.floor = floor
        self.best_regions = None if best_regions is None else tuple((int(a), int(b)) for a, b in best_regions)
        self.proven = bool(proven)
        self.lower_bound_bytes = None if lower_bound_bytes is None else int(lower_bound_bytes)
        self.time_limit_s = time_limit_s
        self.scope = scope
        self.best_inner = tuple((int(a), int(b)) for a, b in best_inner)
        self.best_saved = tuple(int(k) for k in best_saved)
        self.stopped_by = stopped_by
        who = f" for solver {solver!r}" if solver else ""
        if self.proven:
            msg = (
                f"no plan fits a budget of {format_bytes(self.budget_bytes)}{who}: the least feasible budget is "
                f"{format_bytes(self.min_feasible_bytes)} ({self.min_feasible_bytes} bytes)"
                + (f" among {scope}" if scope else "")
                + ". Raise the budget to at least that, or reduce the batch size / sequence length."
            )
        else:
            within = f" within {time_limit_s:g} s" if time_limit_s is not None else ""
            if stopped_by:  # what really stopped the search, not a limit it never reached
                within = f" (stopped by {stopped_by})"
            lower = self.lower_bound_bytes
            best = format_bytes(self.min_feasible_bytes)
            if lower is not None and lower > self.budget_bytes:
                floor_text = (f"more than {format_bytes(self.budget_bytes)}" if lower == self.budget_bytes + 1
                              else f"at least {format_bytes(lower)}")
                msg = (f"no plan fits a budget of {format_bytes(self.budget_bytes)}{who} (proven), but the least "
                       f"feasible budget was not proven{within}: best proven lower bound: {floor_text}; "
                       f"the best plan found peaks at {best} (not proven least).")
            else:
                msg = (f"no plan found{within} for a budget of {format_bytes(self.budget_bytes)}{who} (not proven "
                       f"infeasible): the best plan found peaks at {best} (not proven least)")
                msg += (f"; best proven lower bound on the least feasible budget: {format_bytes(lower)}."
                        if lower is not None else ".")
            lever = ("CP-SAT's work limit (-S work_limit=...)" if "work limit" in stopped_by
                     else "the time limit (--time-limit)")
            msg += f" Raise {lever} to search longer, or the budget to {best}."
        if floor:
            msg += f" {floor}"
        super().__init__(msg)

    def with_floor(self, floor: str) -> "InfeasibleBudget":
        """The same error with ``floor`` (what sets the least peak) added to its message."""
        return self.replace(floor=floor)

    def replace(self, **changes: object) -> "InfeasibleBudget":
        """The same error with some attributes changed (the message follows)."""
        kw = dict(solver=self.solver, floor=self.floor, best_regions=self.best_regions, proven=self.proven,
                  lower_bound_bytes=self.lower_bound_bytes, time_limit_s=self.time_limit_s, scope=self.scope,
                  best_inner=self.best_inner, best_saved=self.best_saved, stopped_by=self.stopped_by)
        kw.update(changes)
        return InfeasibleBudget(self.budget_bytes, self.min_feasible_bytes, **kw)  # type: ignore[arg-type]


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``12.30 MiB``: binary units, for people."""
    n = float(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
