"""The user's side: trace a model, solve under a budget, apply, measure.

Example:
    >>> import scheduler
    >>> graph = scheduler.trace(model, example_inputs)
    >>> plan = scheduler.solve(graph, budget="6GiB", solver="ilp")
    >>> plan.save("plan.json")
    >>> scheduler.apply(model, plan)     # in place: the regions are submodule calls; then train as before

torch is imported only by the parts that trace, apply or measure; they are
loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphs import CkptError, Graph, GraphError, Node, load as load_graph, save as save_graph
from solvers import (
    InfeasibleBudget,
    Plan,
    PlanError,
    PlanMismatch,
    Simulation,
    Status,
    UnknownSolver,
    available_solvers,
    load_plan,
)

from .sizing.budget import BudgetError, format_bytes, parse_budget, parse_size
from .api import simulate, solve
from .sizing.search import fit  # torch-free; eager because a lazy name equal to its submodule's is shadowed by `import scheduler.fit`

__all__ = [
    "CkptError", "Graph", "GraphError", "Node", "load_graph", "save_graph",
    "InfeasibleBudget", "Plan", "PlanError", "PlanMismatch", "Simulation", "Status", "UnknownSolver",
    "available_solvers", "load_plan", "simulate",
    "BudgetError", "format_bytes", "parse_budget", "parse_size", "solve",
    "trace", "apply", "remove", "fit",
]

# Names served lazily (they import torch): name -> "module:attribute".
_LAZY = {
    "trace": "scheduler.tracer:trace",
    "apply": "scheduler.applying:apply",
    "remove": "scheduler.applying:remove",
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    mod, attr = target.split(":")
    value = getattr(importlib.import_module(mod), attr)
    globals()[name] = value
    return value
