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

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

# ``import scheduler`` loads none of graphs, solvers or numpy: each name below is imported on first use, so
# ``ckpt`` can arm its time limit before the imports (NOTE [ A limit kept from the first instant ] in
# ``scheduler.launch``): at a load of 8 they alone took 2.1-2.5 s.
_NAMES = {
    "graphs": ("CkptError", "Graph", "GraphError", "Node"),
    "solvers": ("InfeasibleBudget", "Plan", "PlanError", "PlanMismatch", "Simulation", "Status", "UnknownSolver",
                "available_solvers", "load_plan"),
    "scheduler.api": ("fit", "simulate", "solve", "solve_compiled"),
    "scheduler.measuring.inductor": ("compiled_bound",),  # torch, loaded on first use as the verbs of api.LAZY
    "scheduler.sizing.budget": ("BudgetError", "format_bytes", "parse_size"),
    "scheduler.sizing.memory": ("parse_budget",),
}
_FROM = {name: (module, name) for module, names in _NAMES.items() for name in names}
_FROM.update(load_graph=("graphs", "load"), save_graph=("graphs", "save"))

if TYPE_CHECKING:  # what the names are, for readers and type checkers
    from graphs import CkptError, Graph, GraphError, Node, load as load_graph, save as save_graph
    from solvers import (InfeasibleBudget, Plan, PlanError, PlanMismatch, Simulation, Status, UnknownSolver,
                         available_solvers, load_plan)

    from . import api
    from .api import fit, simulate, solve, solve_compiled
    from .measuring.inductor import compiled_bound
    from .sizing.budget import BudgetError, format_bytes, parse_size
    from .sizing.memory import parse_budget

__all__ = [
    "CkptError", "Graph", "GraphError", "Node", "load_graph", "save_graph",
    "InfeasibleBudget", "Plan", "PlanError", "PlanMismatch", "Simulation", "Status", "UnknownSolver",
    "available_solvers", "load_plan",
    "BudgetError", "format_bytes", "parse_budget", "parse_size",
    "trace", "solve", "simulate", "apply", "remove", "verify", "fit", "compare", "solve_compiled", "compiled_bound",
]


def __getattr__(name: str) -> Any:
    # A name of the package's surface, loaded on first use: the re-exports above, a submodule (``from scheduler
    # import cli`` asks here first: it must not load ``api``, which imports graphs and solvers), else a verb
    # that imports torch (``api.LAZY``). No submodule of this package is named like a verb.
    if name in _FROM:
        module, attr = _FROM[name]
        value = getattr(importlib.import_module(module), attr)
    elif name.startswith("__"):
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        api = importlib.import_module("scheduler.api")
        if name not in api.LAZY:
            raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
        value = getattr(api, name)
    globals()[name] = value
    return value
