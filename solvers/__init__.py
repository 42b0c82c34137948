"""Plans, the execution model, and the algorithms ``(graph, budget) -> plan``.

No torch import here. ``solve(graph, budget_bytes, solver=NAME)`` runs any
registered solver; ``simulate(graph, plan)`` is the one cost model.
"""

from .errors import CkptError, InfeasibleBudget, PlanError, PlanMismatch, UnknownOption, UnknownSolver, format_bytes
from .plan import PLAN_FORMAT_VERSION, Plan, Status, load_plan
from .simulate import Simulation, activation_budget_bytes, simulate, store_all_peak
from .brute_force import brute_force, enumerate_plans, pareto_frontier
from .registry import available_solvers, get_solver, register, solve
from . import baselines  # noqa: F401  (registers store-all, uniform, per-module)
from . import chen, dp, ilp  # noqa: F401  (register chen, chen-sqrt, chen-greedy, dp, ilp)
from .dp import DPTable, dp_table
from .stages import Stages, stages

__all__ = [
    "CkptError", "InfeasibleBudget", "PlanError", "PlanMismatch", "UnknownOption", "UnknownSolver", "format_bytes",
    "PLAN_FORMAT_VERSION", "Plan", "Status", "load_plan",
    "Simulation", "simulate", "store_all_peak", "activation_budget_bytes",
    "brute_force", "enumerate_plans", "pareto_frontier",
    "available_solvers", "get_solver", "register", "solve",
    "DPTable", "dp_table", "Stages", "stages",
]
