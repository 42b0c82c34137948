"""The user's side: trace a model, solve under a budget, apply, measure (the verbs live in ``scheduler.api``).

Example:
    >>> import scheduler
    >>> graph = scheduler.trace(model, example_inputs)
    >>> plan = scheduler.solve(graph, budget="6GiB", solver="ilp")
    >>> plan.save("plan.json")
    >>> scheduler.apply(model, plan)     # in place: the regions are submodule calls; then train as before

torch is imported only by the parts that trace, apply or measure; they are
loaded on first use.

Owns, bottom up (``tests/test_layers.py``): ``progress`` and ``report``; ``sizing`` (budgets, a step's memory,
the floor); ``distributed`` (layouts, no torch); ``models``, ``tracing``, ``measuring`` (torch); ``applying``;
what composes them (``verify``, fit's search, ``comparing``); ``api``; the CLI (``cli``, ``commands``). May import
``graphs`` and ``solvers``; nothing of the project imports it but the CLI, tests and benchmarks.
"""

from __future__ import annotations

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

from . import api
from .api import fit, simulate, solve, solve_compiled
from .sizing.budget import BudgetError, format_bytes, parse_size
from .sizing.memory import parse_budget

__all__ = [
    "CkptError", "Graph", "GraphError", "Node", "load_graph", "save_graph",
    "InfeasibleBudget", "Plan", "PlanError", "PlanMismatch", "Simulation", "Status", "UnknownSolver",
    "available_solvers", "load_plan",
    "BudgetError", "format_bytes", "parse_budget", "parse_size",
    "trace", "solve", "simulate", "apply", "remove", "verify", "fit", "compare", "solve_compiled",
]


def __getattr__(name: str) -> Any:
    # The verbs that import torch (``api.LAZY``), loaded on first use. No submodule of this
    # package is named like a verb, so ``import scheduler.<module>`` never hides one.
    if name not in api.LAZY:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    value = getattr(api, name)
    globals()[name] = value
    return value
