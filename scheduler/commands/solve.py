"""``ckpt solve GRAPH --budget B --solver NAME -o plan.json``."""

from __future__ import annotations

import argparse

from graphs import CkptError
from solvers import InfeasibleBudget, Plan, available_solvers, format_bytes, solver_info

from solvers.deadline import already_spent

from ..api import solve
from ..sizing.floor import explain_floor
from ..sizing.budget import read_budget
from ..sizing.memory import parse_budget, parse_reserve, step_budget_bytes
from ..progress import phase
from ..report import checkpoints_line, cost_model, format_seconds, plan_summary, ratio, table
from .limits import OUTPUT_S, CommandDeadline, command_limit, keep_to_exit, let_go, load_graph, thaw
from .layout import add_layout_arguments, layout_from_args, run_solve as run_layout_solve
from .common import (add_loop_flag, add_step_flags, check_outputs, gap_fraction, positive_float, solve_flag_options,
                     solver_options_help, split_items)

NAME = "solve"
HELP = "choose the checkpoint regions of a graph under a memory budget"
DESCRIPTION = """Solve which activations to keep for GRAPH under a memory budget.

GRAPH is a cost-graph JSON file (see `ckpt trace`). The budget is for the
whole step (parameters, gradients, activations), e.g. 6GiB, 512MiB, 1.5GB or
bytes, or a fraction in (0, 1] of the store-all activations (0.3: store-all's
peak less 70 % of its activation peak; 1 is store-all's peak). With
--optimizer, --mixed-precision and --reserve a budget in bytes also holds
what the graph does not (the optimizer's state, the fp32 master copy, a
reserve), taken off first as `ckpt fit` takes it off a card.
--solver all runs every solver and prints them side by side. The plan's
summary names the submodule calls it checkpoints.

examples:
  ckpt solve graph.json --budget 2GiB --solver ilp --time-limit 30 -o plan.json
  ckpt solve graph.json --budget 0.3 --solver all
  ckpt solve graph.json --budget 24GiB --optimizer adamw --mixed-precision --reserve 5% -o plan.json
  ckpt solve graph.json --budget 0.5 --solver cp-sat -S work_limit=10 -S workers=4
  ckpt solve --solver ilp --help-options

Solver options (NOTE [ Solver options ]): --time-limit, --gap and --method set
time_limit_s, gap_limit and method, and -S KEY=VALUE any option, its value
read as the type the solver declares; a solver that does not take one says
so (with --solver all, each solver gets those it takes). ilp, cp-sat and
frontier answer the same on a busy machine: CP-SAT stops at a deterministic
work limit (-S work_limit=...), and --time-limit is only a safety net.

The solvers minimise the graph's recompute cost (`ckpt trace --costs`: a
roofline time per op by default); the summary prints the recomputed FLOPs
and the predicted recompute time."""




class _HelpOptions(argparse.Action):
    """``--help-options``: print the options of ``--solver`` (given before it; every solver otherwise), exit."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        name = getattr(namespace, "solver", None)
        names = [name] if name and name != "all" and name in available_solvers(methods=True) else \
            available_solvers(methods=True)
        print(solver_options_help(names))
        parser.exit(0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help="cost graph JSON")
    p.add_argument("--budget", "-b", required=True, help="6GiB, 512MiB, bytes, or a fraction such as 0.3")
    p.add_argument("--solver", "-s", default=None,
                   help=f"one of: {', '.join(available_solvers(methods=True))}, or 'all' (default: ilp, exact where "
                        "it can be and never without a plan where another solver finds one; frontier and cp-sat are "
                        "its two methods on their own)")
    p.add_argument("--time-limit", type=positive_float, default=None,
                   help="wall-clock seconds for ilp, cp-sat, frontier, dp (a safety net; default: 60)")
    p.add_argument("--gap", type=gap_fraction, default=None,
                   help="ilp, cp-sat: stop once the proven gap is at most this fraction, e.g. 0.01 "
                        "(default: prove optimality)")
    p.add_argument("--method", choices=("auto", "frontier", "cp-sat"), default=None,
                   help="ilp: 'frontier' (exact program for graphs where few tensors cross any position), "
                        "'cp-sat' (any DAG, with a bound and gap) or 'auto' (the first when it applies; default)")
    p.add_argument("--chunks", type=_chunk_counts, default=None, metavar="K,K,...",
                   help="also try the LM head and its loss in K row chunks, each recomputed (e.g. 1,2,4,8,16); the "
                        "cheapest plan that fits wins (transformers causal/masked LMs traced with labels)")
    p.add_argument("--mlp-chunks", type=_chunk_counts, default=None, metavar="K,K,...",
                   help="also try every row-wise call (an MLP) in K row chunks, each recomputed (e.g. 1,2,4)")
    p.add_argument("--nested", action="store_true",
                   help="regions may nest one level: each region's child calls checkpointed again inside its "
                        "recompute (a second recompute for less memory); the cheapest plan that fits wins")
    p.add_argument("-S", "--solver-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a solver option, repeatable, e.g. -S work_limit=10 (see --help-options)")
    p.add_argument("--help-options", nargs=0, action=_HelpOptions,
                   help="list each solver's options (those of --solver when it comes first) and exit")
    add_step_flags(p, optimizer=None, reserve="0", budget="budget (in bytes)")
    add_loop_flag(p, default=None, what="plan for (default: the graph's, as traced)")
    p.add_argument("-o", "--output", help="write the plan here (JSON; with --solver all, the cheapest plan that fits; "
                                          "with --pp, one file per stage: NAME.stage0.json, ...)")
    add_layout_arguments(p, budget="budget")


def _check_all(args: argparse.Namespace) -> None:
    """With ``--solver all``: each flag and ``-S`` key must be taken by some solver (each gets those it takes)."""
    takes = {o.name for n in available_solvers() for o in solver_info(n).options}
    for key, _ in split_items(args.solver_option):
        if key not in takes:
            raise CkptError(f"-S {key}=...: no solver takes option {key!r} (ckpt solve --help-options)")
    for name in available_solvers():
        solve_flag_options(name, args, strict=False)  # a value of the wrong type is an error before any work


def _spent(args: argparse.Namespace) -> float:
    """Seconds this command has run (NOTE [ One deadline ]: set by ``scheduler.cli.main``; 0 when called
    otherwise)."""
    spent = getattr(args, "_spent", None)
    return float(spent()) if callable(spent) else 0.0


def _terms(args: argparse.Namespace) -> str:
    """What the budget holds beside the graph's tensors, as the user gave it."""
    terms = [f"{args.optimizer} state" if args.optimizer not in (None, "none") else "",
             "the fp32 master copy" if args.mixed_precision else "", f"a reserve of {args.reserve}" if args.reserve else ""]
    return ", ".join(t for t in terms if t)


def _chunk_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"chunk counts are integers >= 1 separated by commas (1,2,4,8,16), got {text!r}")
    return counts


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    finally:
        thaw()  # NOTE [ The command's time limit ]: the graph's objects the collector's again


def _run(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    if layout is not None:  # one rank's card, one plan per pipeline stage (scheduler.commands.layout)
        read_budget(args.budget)
        return run_layout_solve(args, layout)
    args.solver = args.solver or "ilp"
    if args.solver != "all" and args.solver not in available_solvers(methods=True):
        raise CkptError(f"unknown solver {args.solver!r}; available: {', '.join(available_solvers(methods=True))}, "
                        "or all")
    if args.solver == "all":
        _check_all(args)
    else:
        solve_flag_options(args.solver, args)  # a flag the solver does not take is an error before any work
    read_budget(args.budget)  # a bad budget or reserve is an error before any work
    if args.reserve is not None:
        parse_reserve(args.reserve, 1 << 62)
    check_outputs([("-o", args.output)], inputs=[args.graph])
    # NOTE [ The command's time limit ]: the limit the solve keeps covers reading its input too
    limit = None if args.solver == "all" else command_limit(args.solver, solve_flag_options(args.solver, args))
    deadline = None if limit is None else CommandDeadline(limit, _spent(args))
    let_go()
    graph = load_graph(args.graph, deadline)
    keep_to_exit(graph)  # freed by the process's end, after the answer, not as this returns
    if args.loop:  # NOTE [ The user's loop ]: the same graph planned for another loop
        graph = graph.with_loop(args.loop)

    def budgets() -> tuple[int, int]:
        return (step_budget_bytes(args.budget, graph, optimizer=args.optimizer, mixed_precision=args.mixed_precision,
                                  reserve=args.reserve or 0), parse_budget(args.budget, graph))

    budget, plain = budgets() if deadline is None else deadline.run("working out the budget", budgets)
    if budget != plain:
        print(f"budget {args.budget} for the whole step: solvers plan against {format_bytes(budget)} (less "
              f"{_terms(args)})")
    if args.solver != "all":
        if deadline is not None:
            deadline.left_for_solve()
        spent = deadline.spent_s() if deadline is not None else _spent(args) + OUTPUT_S
        try:
            with phase(f"solving with {args.solver}"), already_spent(spent):
                plan = solve(graph, budget, solver=args.solver, chunks=args.chunks, mlp_chunks=args.mlp_chunks,
                             nested=args.nested, **solve_flag_options(args.solver, args))
        except CkptError as exc:
            if deadline is None:
                raise
            raise deadline.note(exc) from None
        if args.output:
            plan.save(args.output)  # before printing: a closed stdout must not lose the plan
        print(plan_summary(graph, plan))
        if args.output:
            print(f"plan written to {args.output}")
        return 0
    step = graph.total_fwd_flops() + graph.total_bwd_flops()
    rows, best, lowest = [], None, None
    for name in available_solvers():
        try:
            with phase(f"solving with {name}"):
                plan = solve(graph, budget, solver=name, chunks=args.chunks, mlp_chunks=args.mlp_chunks,
                             nested=args.nested, **solve_flag_options(name, args, strict=False))
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
    print(f"cheapest: {best.solver}, {checkpoints_line(best)}")
    if args.output:
        print(f"plan written to {args.output}")
    return 0
