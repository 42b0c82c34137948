"""``ckpt simulate GRAPH.json [PLAN.json]``."""

from __future__ import annotations

import argparse

import graphs
from solvers import load_plan
from solvers.model.chunks import expand

from ..api import simulate
from ..report import checkpoints_line, regions_table, simulation_summary

NAME = "simulate"
HELP = "print the simulated peak memory of a plan (or of store-all) and its breakdown"
DESCRIPTION = """Walk the forward and backward pass of GRAPH under PLAN exactly as
torch.utils.checkpoint(use_reentrant=False) would execute it, and print the peak,
the step where it happens, and what it is made of.

example:
  ckpt simulate graph.json plan.json
  ckpt simulate graph.json            # no plan: store everything"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help="cost graph JSON (from `ckpt trace` or written by hand)")
    p.add_argument("plan", nargs="?", help="plan JSON (from `ckpt solve`); omit for store-all")
    p.add_argument("--no-check", action="store_true",
                   help="cost a plan that carries no fingerprint, or another graph's (its regions must still fit)")


def run(args: argparse.Namespace) -> int:
    graph = graphs.load(args.graph)
    plan = load_plan(args.plan) if args.plan else None
    sim = simulate(graph, plan, check=not args.no_check)
    print(simulation_summary(expand(graph, plan.chunks) if plan else graph, sim, plan.budget_bytes if plan else None))
    if plan is not None:
        print(checkpoints_line(plan))
        if plan.regions:
            print(regions_table(graph, plan))
    return 0
