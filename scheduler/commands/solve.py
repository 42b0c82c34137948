"""``ckpt solve GRAPH --budget B --solver NAME -o plan.json``."""

from __future__ import annotations

import argparse

import graphs
from graphs import CkptError
from solvers import Plan, available_solvers, format_bytes

from ..api import solve
from ..explain import explain_floor
from ..budget import parse_budget
from ..report import plan_summary, ratio, table

NAME = "solve"
HELP = "choose the checkpoint regions of a graph under a memory budget"
DESCRIPTION = """Solve which activations to keep for GRAPH under a memory budget.

GRAPH is a cost-graph JSON file (see `ckpt trace`). The budget is for the
whole step (parameters, gradients, activations), e.g. 6GiB, 512MiB, 1.5GB or
bytes, or a fraction in (0, 1] of the store-all activation peak (0.3).
--solver all runs every solver and prints them side by side.

examples:
  ckpt solve graph.json --budget 2GiB --solver ilp --time-limit 30 -o plan.json
  ckpt solve graph.json --budget 0.3 --solver all"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help="cost graph JSON")
    p.add_argument("--budget", "-b", required=True, help="6GiB, 512MiB, bytes, or a fraction such as 0.3")
    p.add_argument("--solver", "-s", default="dp",
                   help=f"one of: {', '.join(available_solvers())}, or 'all' (default: dp)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds for the ilp solver (default: 60)")
    p.add_argument("--gap", type=float, default=0.0,
                   help="ilp: stop once the proven gap is at most this fraction, e.g. 0.01 (default: prove optimality)")
    p.add_argument("--method", choices=("auto", "frontier", "cp-sat"), default="auto",
                   help="ilp: 'frontier' (exact program for graphs where few tensors cross any position), "
                        "'cp-sat' (any DAG, with a bound and gap) or 'auto' (the first when it applies; default)")
    p.add_argument("--optimizer", default=None, help="subtract this optimizer's state from the budget (adam, sgd, ...)")
    p.add_argument("-o", "--output", help="write the plan here (JSON; with --solver all, the cheapest plan that fits)")


def _options(name: str, args: argparse.Namespace) -> dict:
    return {"time_limit_s": args.time_limit, "gap_limit": args.gap, "method": args.method} if name == "ilp" else {}


def run(args: argparse.Namespace) -> int:
    graph = graphs.load(args.graph)
    if args.solver != "all":
        plan = solve(graph, args.budget, solver=args.solver, optimizer=args.optimizer, **_options(args.solver, args))
        print(plan_summary(graph, plan))
        if args.output:
            plan.save(args.output)
            print(f"plan written to {args.output}")
        return 0
    budget = parse_budget(args.budget, graph, optimizer=args.optimizer)
    step = graph.total_fwd_flops() + graph.total_bwd_flops()
    rows, best, lowest = [], None, None
    for name in available_solvers():
        try:
            plan = solve(graph, budget, solver=name, **_options(name, args))
        except CkptError as exc:
            least = getattr(exc, "min_feasible_bytes", None)
            regions = getattr(exc, "best_regions", None)
            if regions is not None and (lowest is None or least < lowest[0]):
                lowest = (least, regions)
            status = f"infeasible (needs {format_bytes(least)})" if least is not None else f"n/a: {str(exc).split(';')[0]}"
            rows.append((name, status, "", "", format_bytes(budget), "", "", ""))
            continue
        rows.append((name, plan.status, len(plan.regions), format_bytes(plan.peak_bytes), format_bytes(budget),
                     ratio(plan.recompute_flops / step if step else 0.0), f"{plan.solve_time_s:.2f}s",
                     "" if plan.gap is None else ratio(plan.gap)))
        if best is None or plan.recompute_flops < best.recompute_flops:
            best = plan
    print(table(rows, ["solver", "status", "regions", "predicted peak", "budget", "recompute", "solve time", "gap"]))
    if best is None:
        print("no solver found a plan that fits")
        print(explain_floor(graph, None if lowest is None else Plan(regions=lowest[1])).text)
        return 2
    print(f"cheapest: {best.solver}")
    if args.output:
        best.save(args.output)
        print(f"plan written to {args.output}")
    return 0
