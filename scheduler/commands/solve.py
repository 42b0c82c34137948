"""``ckpt solve GRAPH --budget B --solver NAME -o plan.json``."""

from __future__ import annotations

import argparse

import graphs
from graphs import CkptError
from solvers import InfeasibleBudget, Plan, available_solvers, format_bytes

from ..api import solve
from ..explain import explain_floor
from ..budget import optimizer_state_bytes, parse_budget, read_budget
from ..progress import phase
from ..report import cost_model, format_seconds, plan_summary, ratio, table
from .common import check_outputs, gap_fraction, positive_float, reject_options

NAME = "solve"
HELP = "choose the checkpoint regions of a graph under a memory budget"
DESCRIPTION = """Solve which activations to keep for GRAPH under a memory budget.

GRAPH is a cost-graph JSON file (see `ckpt trace`). The budget is for the
whole step (parameters, gradients, activations), e.g. 6GiB, 512MiB, 1.5GB or
bytes, or a fraction in (0, 1] of the store-all activations (0.3: store-all's
peak less 70 % of its activation peak; 1 is store-all's peak).
--solver all runs every solver and prints them side by side.

examples:
  ckpt solve graph.json --budget 2GiB --solver ilp --time-limit 30 -o plan.json
  ckpt solve graph.json --budget 0.3 --solver all

--time-limit, --gap and --method are ilp's; another solver refuses them.

The solvers minimise the graph's recompute cost (`ckpt trace --costs`: a
roofline time per op by default); the summary prints the recomputed FLOPs
and the predicted recompute time."""


#: The solver flags and the solvers that take them (others refuse them: NOTE [ How the CLI fails ]).
SOLVER_FLAGS = {"ilp": ("--time-limit", "--gap", "--method")}
DEFAULT_TIME_LIMIT_S = 60.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help="cost graph JSON")
    p.add_argument("--budget", "-b", required=True, help="6GiB, 512MiB, bytes, or a fraction such as 0.3")
    p.add_argument("--solver", "-s", default="ilp",
                   help=f"one of: {', '.join(available_solvers())}, or 'all' (default: ilp, exact where it can be "
                        "and never without a plan where another solver finds one)")
    p.add_argument("--time-limit", type=positive_float, default=None,
                   help=f"seconds for the ilp solver (default: {DEFAULT_TIME_LIMIT_S:g})")
    p.add_argument("--gap", type=gap_fraction, default=None,
                   help="ilp: stop once the proven gap is at most this fraction, e.g. 0.01 (default: prove optimality)")
    p.add_argument("--method", choices=("auto", "frontier", "cp-sat"), default=None,
                   help="ilp: 'frontier' (exact program for graphs where few tensors cross any position), "
                        "'cp-sat' (any DAG, with a bound and gap) or 'auto' (the first when it applies; default)")
    p.add_argument("--optimizer", default=None, help="subtract this optimizer's state from the budget (adam, sgd, ...)")
    p.add_argument("-o", "--output", help="write the plan here (JSON; with --solver all, the cheapest plan that fits)")


def _options(name: str, args: argparse.Namespace) -> dict:
    if name != "ilp":
        return {}
    return {"time_limit_s": args.time_limit if args.time_limit is not None else DEFAULT_TIME_LIMIT_S,
            "gap_limit": args.gap or 0.0, "method": args.method or "auto"}


def run(args: argparse.Namespace) -> int:
    if args.solver != "all" and args.solver not in available_solvers():
        raise CkptError(f"unknown solver {args.solver!r}; available: {', '.join(available_solvers())}, or all")
    reject_options(args.solver, {"--time-limit": args.time_limit, "--gap": args.gap, "--method": args.method},
                   SOLVER_FLAGS)
    read_budget(args.budget)  # a bad budget or optimizer is an error before any work
    optimizer_state_bytes(0, args.optimizer)
    check_outputs([("-o", args.output)], inputs=[args.graph])
    graph = graphs.load(args.graph)
    if args.solver != "all":
        with phase(f"solving with {args.solver}"):
            plan = solve(graph, args.budget, solver=args.solver, optimizer=args.optimizer,
                         **_options(args.solver, args))
        if args.output:
            plan.save(args.output)  # before printing: a closed stdout must not lose the plan
        print(plan_summary(graph, plan))
        if args.output:
            print(f"plan written to {args.output}")
        return 0
    budget = parse_budget(args.budget, graph, optimizer=args.optimizer)
    step = graph.total_fwd_flops() + graph.total_bwd_flops()
    rows, best, lowest = [], None, None
    for name in available_solvers():
        try:
            with phase(f"solving with {name}"):
                plan = solve(graph, budget, solver=name, **_options(name, args))
        except InfeasibleBudget as exc:
            if exc.best_regions is not None and (lowest is None or exc.min_feasible_bytes < lowest[0]):
                lowest = (exc.min_feasible_bytes, exc.best_regions)
            need = format_bytes(exc.min_feasible_bytes)
            within = f" in {exc.time_limit_s:g}s" if exc.time_limit_s is not None else ""
            status = (f"none found{within} (one at {need})" if not exc.proven else
                      f"infeasible (its plans need {need})" if exc.scope else f"infeasible (needs {need})")
            rows.append((name, status, "", "", format_bytes(budget), "", "", "", ""))
            continue
        except CkptError as exc:
            rows.append((name, f"n/a: {str(exc).split(';')[0]}", "", "", format_bytes(budget), "", "", "", ""))
            continue
        rows.append((name, plan.status, len(plan.regions), format_bytes(plan.peak_bytes), format_bytes(budget),
                     ratio(plan.recompute_flops / step if step else 0.0),
                     "" if plan.recompute_time_s is None else format_seconds(plan.recompute_time_s),
                     f"{plan.solve_time_s:.2f}s", "" if plan.gap is None else ratio(plan.gap)))
        if best is None or plan.recompute_cost < best.recompute_cost:  # the objective the solvers minimise
            best = plan
    if best is not None and args.output:
        best.save(args.output)
    print(table(rows, ["solver", "status", "regions", "predicted peak", "budget", "recompute FLOPs",
                       "recompute time", "solve time", "gap"]))
    if cost_model(graph):
        print(f"recompute time predicted by {cost_model(graph)}")
    if best is None:
        print("no solver found a plan that fits")
        print(explain_floor(graph, None if lowest is None else Plan(regions=lowest[1])).text)
        return 2
    print(f"cheapest: {best.solver}")
    if args.output:
        print(f"plan written to {args.output}")
    return 0
