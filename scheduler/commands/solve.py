"""``ckpt solve GRAPH --budget B --solver NAME -o plan.json``."""

from __future__ import annotations

import argparse

import graphs
from solvers import available_solvers, simulate

from ..api import solve
from ..report import plan_summary

NAME = "solve"
HELP = "choose the checkpoint regions of a graph under a memory budget"
DESCRIPTION = """Solve which activations to keep for GRAPH under a memory budget.

GRAPH is a cost-graph JSON file (see `ckpt trace`). The budget is for the
whole step (parameters, gradients, activations), e.g. 6GiB, 512MiB, 1.5GB or
bytes, or a fraction in (0, 1] of the store-all activation peak (0.3).

example:
  ckpt solve graph.json --budget 2GiB --solver uniform -o plan.json"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help="cost graph JSON")
    p.add_argument("--budget", "-b", required=True, help="6GiB, 512MiB, bytes, or a fraction such as 0.3")
    p.add_argument("--solver", "-s", default="dp",
                   help=f"one of: {', '.join(available_solvers())}, or 'all' (default: dp)")
    p.add_argument("--optimizer", default=None, help="subtract this optimizer's state from the budget (adam, sgd, ...)")
    p.add_argument("-o", "--output", help="write the plan here (JSON)")


def run(args: argparse.Namespace) -> int:
    graph = graphs.load(args.graph)
    plan = solve(graph, args.budget, solver=args.solver, optimizer=args.optimizer)
    print(plan_summary(graph, plan))
    if args.output:
        plan.save(args.output)
        print(f"plan written to {args.output}")
    return 0
