"""``ckpt demo``: trace a GPT-2-shaped model, solve with every solver, apply the best plan, verify."""

from __future__ import annotations

import argparse
import time

import solvers
from solvers import InfeasibleBudget, format_bytes, simulate

from ..sizing.budget import read_budget
from ..progress import phase
from ..report import ratio, table
from .common import positive_float, positive_int

NAME = "demo"
HELP = "trace a GPT-2-shaped model, solve with every solver, apply and verify the best plan"
DESCRIPTION = """The whole loop on the built-in GPT-2-shaped model (GPT-2 small's blocks: width
768, 12 heads; by default 3 layers, a vocabulary of 8192, sequence 768, batch
1, 2 measured steps, so that it runs in under 3 minutes on 2 busy CPU cores): trace it into a
cost graph, solve under the budget with every registered solver, apply the
plan with the least recompute, run real steps with and without it, and say
what sets the least reachable peak. --vocab 50257 is GPT-2's own vocabulary
(its LM head then takes half of every step and sets the floor).

example:
  ckpt demo
  ckpt demo --budget 0.3 --layers 6 --seq 1024
  ckpt demo --seq 256          # here no plan lowers the peak much; the demo says which node sets it"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", "-b", default="0.6", help="6GiB, 512MiB, bytes, or a fraction of the store-all "
                   "activations (default 0.6: store-all's peak less 40 %% of its activation peak)")
    p.add_argument("--layers", type=positive_int, default=3)
    p.add_argument("--vocab", type=positive_int, default=8192, help="vocabulary (default 8192; GPT-2's is 50257)")
    p.add_argument("--seq", type=positive_int, default=768,
                   help="sequence length (default 768: much shorter sequences put the peak in the embedding/LM-head "
                        "backward, which no plan lowers; the demo then says so)")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--costs", choices=["roofline", "time", "flops"], default="roofline",
                   help="what the solvers minimise: a roofline time per node on this device (default), its "
                        "measured forward time, or counted FLOPs")
    p.add_argument("--steps", type=positive_int, default=2, help="measured steps of each kind after a warm-up "
                   "(default 2; more steadies the time ratio)")
    p.add_argument("--time-limit", type=positive_float, default=10.0, dest="time_limit",
                   help="time limit per solver in seconds, for those that take one (default 10)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..api import solve
    from ..sizing.floor import explain_floor
    from ..models import build
    from .. import applying  # noqa: F401  (NOTE [ Recompute timed in the step ])
    from ..tracing.tracer import capture
    from ..measuring.verification import verify

    read_budget(args.budget)  # before the model is built
    t0 = time.perf_counter()
    torch.manual_seed(0)
    ex = build("gpt", layers=args.layers, vocab=args.vocab, seq=args.seq, batch=args.batch)
    with phase("tracing gpt"):
        traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, costs=args.costs)
    graph = traced.graph
    store_all = simulate(graph, None, record=False)
    print(f"gpt: {args.layers} layers, width 768, vocabulary {args.vocab}, sequence {args.seq}, batch {args.batch}: "
          f"{len(graph)} nodes (granularity {traced.granularity}), traced in {time.perf_counter() - t0:.1f}s")
    print(f"store-all peak {format_bytes(store_all.peak_bytes)} (activations {format_bytes(store_all.activation_peak_bytes)}),"
          f" during the {store_all.peak_phase} of {store_all.peak_node}")

    rows, plans, floors = [], [], []
    for name in solvers.available_solvers():
        options = {"time_limit_s": args.time_limit} if name == "ilp" else {}
        try:
            with phase(f"solving with {name}"):
                plan = solve(graph, args.budget, solver=name, **options)
        except InfeasibleBudget as exc:
            if exc.proven:
                floors.append(exc.min_feasible_bytes)
            need = "needs" if exc.proven else "none found; one at"
            rows.append((name, "infeasible", "", f"{need} {format_bytes(exc.min_feasible_bytes)}", "", ""))
            continue
        except Exception as exc:  # noqa: BLE001  (one solver failing must not hide the others)
            rows.append((name, f"error: {type(exc).__name__}: {str(exc)[:60]}", "", "", "", ""))
            continue
        plans.append(plan)
        rows.append((name, plan.status, len(plan.regions), format_bytes(plan.peak_bytes),
                     ratio(plan.recompute_flops / store_all.step_flops), f"{plan.solve_time_s:.2f}s"))
    budget_bytes = plans[0].budget_bytes if plans else None
    print(f"budget {args.budget}" + (f" = {format_bytes(budget_bytes)}" if budget_bytes else ""))
    print(table(rows, ["solver", "status", "regions", "predicted peak", "recompute", "solve time"]))

    # What sets the floor: the lowest-peak plan found (a solver's, store-all, or every node checkpointed).
    candidates = [None, *plans, _all_regions(graph)]
    lowest = min(candidates, key=lambda p: simulate(graph, p, record=False).peak_bytes)
    floor = explain_floor(graph, lowest)
    print("\nwhat sets the minimum: " + floor.text)
    if not plans:
        print(f"\nno solver fits {args.budget}; raise the budget to at least "
              f"{format_bytes(min(floors) if floors else floor.best_peak_bytes)}")
        return 1

    best = min(plans, key=lambda p: (p.recompute_flops, p.peak_bytes))
    print(f"\napplying the {best.solver} plan ({len(best.regions)} regions) and running {args.steps} steps with and without it")
    with phase(f"verifying: warm-up and {args.steps} steps with and without the plan"):
        v = verify(ex.model, best, ex.args, dict(ex.kwargs), loss=ex.loss, steps=args.steps, graph=graph)
    print(table(v.rows(), ["", "with the plan", "without"]))
    ok = v.fits and v.grads_equal()
    print(f"\n{'OK' if ok else 'FAIL'}: {'fits' if v.fits else f'does NOT fit ({v.over_budget_bytes:,} B over)'} the budget, gradients "
          f"{'bitwise equal' if v.grads_equal() else 'DIFFER'}; demo took {time.perf_counter() - t0:.0f}s")
    return 0 if ok else 1


def _all_regions(graph):  # type: ignore[no-untyped-def]
    """One region per recomputable node: the most memory any interval plan can free."""
    from solvers import Plan

    regions = [(i, i) for i, nd in enumerate(graph.nodes) if nd.recomputable]
    return Plan.from_regions(graph, regions) if regions else None
