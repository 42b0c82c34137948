"""``scheduler.solve``: the solver registry with budgets people write."""

from __future__ import annotations

from typing import Any

import solvers
from graphs import Graph
from solvers import InfeasibleBudget, Plan

from .budget import BudgetSpec, parse_budget
from .explain import explain_floor

__all__ = ["solve"]


def solve(graph: Graph, budget: BudgetSpec, solver: str = "dp", *, optimizer: str | None = None, **options: Any) -> Plan:
    """Choose which activations to keep for ``graph`` under ``budget``.

    Args:
        graph: a cost graph (``scheduler.trace`` or ``graphs.load``).
        budget: ``"6GiB"``, ``"512MiB"``, bytes, or a fraction in (0, 1] of the
            store-all activation peak.
        solver: a registered solver name (``scheduler.available_solvers()``).
        optimizer: subtract this optimizer's state from a byte budget
            (``adam``, ``adamw``, ``sgd``, ...).
        **options: solver options (e.g. ``time_limit_s`` for ``ilp``).

    Raises:
        BudgetError: the budget cannot be read.
        InfeasibleBudget: nothing fits; ``.min_feasible_bytes`` says what would
            and ``.floor`` which step sets the least peak (``scheduler.explain``).
    """
    budget_bytes = parse_budget(budget, graph, optimizer=optimizer)
    try:
        return solvers.solve(graph, budget_bytes, solver=solver, **options)
    except InfeasibleBudget as exc:
        if exc.floor:
            raise
        best = None if exc.best_regions is None else Plan(regions=exc.best_regions)
        floor = explain_floor(graph, best).text
        raise InfeasibleBudget(exc.budget_bytes, exc.min_feasible_bytes, solver=exc.solver, floor=floor,
                               best_regions=exc.best_regions) from None
