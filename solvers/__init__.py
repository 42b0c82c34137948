"""Plans, the execution model, and the algorithms ``(graph, budget) -> plan``.

No torch import here, and no OR-Tools until CP-SAT runs (``solvers.cpsat.solver``).
``solve(graph, budget_bytes, solver=NAME, **options)`` runs any registered
solver, its options checked against what it declares (NOTE [ Solver options ]
in ``solvers.options``); ``simulate(graph, plan)`` is the one cost model.

Owns, bottom up: ``errors``, ``deadline``, ``options``; ``model`` (the execution model); ``registry``;
the solvers (``baselines``, ``chen``, ``brute_force``, ``warm``, ``ilp``, ``frontier``, ``cpsat``, ``dp``,
``blocks``); ``menus`` (chunk counts, nestings). May import ``graphs`` and nothing of ``scheduler``; each layer
imports only those below it (``tests/test_layers.py``).
"""

from .errors import (CkptError, InfeasibleBudget, MissingDependency, PlanError, PlanMismatch, SolverBug,
                     SolverInputError, SolverOptionError, UnknownOption, UnknownSolver, format_bytes)
from .deadline import Deadline
from .options import Option
from .model.plan import PLAN_FORMAT_VERSION, Plan, Status, load_plan
from .model.simulate import activation_budget_bytes, simulate, store_all_peak
from .model.walk import Simulation
from .model.terms import INF, Terms, terms_of
from .brute_force import brute_force, enumerate_plans, pareto_frontier
from .registry import SolverInfo, available_solvers, exact_solvers, get_solver, register, solve, solver_info
from . import baselines  # noqa: F401  (registers store-all, uniform, per-module)
from . import chen, dp, ilp  # noqa: F401  (register chen, chen-sqrt, chen-greedy, dp, ilp, cp-sat, frontier)
from .dp.chain import DPTable, dp_table
from .model.stages import Stages, stages

__all__ = [
    "CkptError", "InfeasibleBudget", "MissingDependency", "PlanError", "PlanMismatch", "SolverBug",
    "SolverInputError", "SolverOptionError", "UnknownOption", "UnknownSolver", "format_bytes", "Deadline", "Option",
    "PLAN_FORMAT_VERSION", "Plan", "Status", "load_plan",
    "Simulation", "simulate", "store_all_peak", "activation_budget_bytes", "INF", "Terms", "terms_of",
    "brute_force", "enumerate_plans", "pareto_frontier",
    "SolverInfo", "available_solvers", "exact_solvers", "get_solver", "register", "solve", "solver_info",
    "DPTable", "dp_table", "Stages", "stages",
]
