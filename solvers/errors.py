"""Errors raised by plans and solvers. All derive from :class:`graphs.CkptError`."""

from __future__ import annotations

from graphs import CkptError

__all__ = ["CkptError", "PlanError", "PlanMismatch", "InfeasibleBudget", "UnknownSolver", "format_bytes"]


class PlanError(CkptError, ValueError):
    """A plan is malformed (overlapping regions, index out of range, bad JSON)."""


class PlanMismatch(PlanError):
    """A plan was solved for a different graph (model, input shape or dtype)."""


class UnknownSolver(CkptError, KeyError):
    """No solver is registered under the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want a sentence.
        return str(self.args[0]) if self.args else ""


class InfeasibleBudget(CkptError, ValueError):
    """No plan fits the budget.

    Attributes:
        budget_bytes: the budget that was asked for.
        min_feasible_bytes: the least budget for which a plan exists (the
            smallest simulated peak over all plans the solver considers).
        floor: optional explanation of what sets that minimum (which step and
            node), as a sentence.
        best_regions: the regions of the plan that peaks at
            ``min_feasible_bytes``, when the solver has it (``()`` is
            store-all); None when unknown.
    """

    def __init__(self, budget_bytes: int, min_feasible_bytes: int, *, solver: str = "", floor: str = "",
                 best_regions: tuple[tuple[int, int], ...] | None = None) -> None:
        self.budget_bytes = int(budget_bytes)
        self.min_feasible_bytes = int(min_feasible_bytes)
        self.solver = solver
        self.floor = floor
        self.best_regions = None if best_regions is None else tuple((int(a), int(b)) for a, b in best_regions)
        who = f" for solver {solver!r}" if solver else ""
        msg = (
            f"no plan fits a budget of {format_bytes(self.budget_bytes)}{who}: the least feasible budget is "
            f"{format_bytes(self.min_feasible_bytes)} ({self.min_feasible_bytes} bytes). Raise the budget to at least that, "
            "or reduce the batch size / sequence length."
        )
        if floor:
            msg += f" {floor}"
        super().__init__(msg)


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``12.30 MiB``: binary units, for people."""
    n = float(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
