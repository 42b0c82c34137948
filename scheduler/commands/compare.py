"""``ckpt compare MODEL --budgets 0.5,0.7``."""

from __future__ import annotations

import argparse
import json
import os

from graphs import CkptError, write_text_atomic

from ..progress import phase
from .common import add_model_arguments, check_outputs, model_files, model_options, positive_float, positive_int

NAME = "compare"
HELP = "our solvers and the usual tools (per-block, checkpoint_sequential, torch.compile), measured side by side"
DESCRIPTION = """Measure, on one model and input in one process, our solvers' plans and the
tools people use today: no checkpointing, torch.utils.checkpoint around every
block (what HF's gradient_checkpointing_enable() does), checkpoint_sequential
with sqrt(n) segments, and torch.compile (aot_eager, the min-cut partitioner)
with activation_memory_budget at the same fractions.

Per method and budget: predicted peak (simulate) and measured peak (profiler
allocator events, the same for every method), step-time ratio against the
un-checkpointed step (medians, alternated in one run), recompute ratio,
solve time and the largest gradient difference from the un-checkpointed step.
A method that cannot run is listed with the reason.

MODEL is anything `ckpt trace` takes: a built-in model (`ckpt models`),
hf:NAME, or package.module:factory, with the same option flags. The
built-ins and hf:gpt2 run at a CPU-sized shape of their own unless flags say
otherwise; --quick picks a smaller one.

examples:
  ckpt compare gpt --budgets 0.5,0.7 --json out.json --plots plots/
  ckpt compare gpt --quick --budgets 0.6,0.8"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--budgets", default=None,
                   help="fractions of the store-all activation peak, comma separated (default 0.2,0.3,0.5,0.7; "
                   "--quick: 0.3,0.5)")
    p.add_argument("--solvers", default=None, help="our solvers, comma separated (default: chen, chen-greedy, dp, ilp "
                   "as registered; --quick: ilp, which starts from dp and chen and is exact where it can be)")
    p.add_argument("--no-peers", action="store_true", help="measure only our solvers (and no checkpointing)")
    p.add_argument("--quick", action="store_true", help="a small model size, two budgets, fewer timed steps")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed steps per method (default 5, --quick 3)")
    p.add_argument("--ilp-time-limit", type=positive_float, default=30.0,
                   help="seconds for the ILP solver (default 30)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch intra-op threads while measuring (default: torch's; 1 is steadier on a shared machine)")
    p.add_argument("--costs", choices=["roofline", "time", "flops"], default="roofline",
                   help="what our solvers minimise, and how the best plan is picked: roofline time per node "
                   "(default, the solvers' own), measured forward time per node, or counted FLOPs")
    p.add_argument("--json", dest="json_path", help="write the results as JSON here")
    p.add_argument("--plots", help="write PNG plots into this folder (needs matplotlib)")


def _fractions(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CkptError(f"--budgets takes fractions separated by commas, e.g. 0.2,0.3,0.5; got {text!r}") from None
    if not out or not all(0 < f <= 1 for f in out):
        raise CkptError(f"--budgets must be fractions in (0, 1] of the store-all activation peak; got {text!r}")
    return out


def _quick_solvers() -> list[str]:
    """ilp when registered (it starts from dp and chen and is exact where it can be), else the first of dp, chen."""
    from solvers import available_solvers

    names = available_solvers()
    return [next((s for s in ("ilp", "dp", "chen", "uniform") if s in names), names[-1])]


def run(args: argparse.Namespace) -> int:
    from ..comparing.run import compare, format_table
    from ..comparing.workloads import workload

    from solvers import available_solvers

    quick = args.quick
    fractions = _fractions(args.budgets or ("0.3,0.5" if quick else "0.2,0.3,0.5,0.7"))
    names = [s.strip() for s in args.solvers.split(",")] if args.solvers else (_quick_solvers() if quick else None)
    unknown = [s for s in names or () if s not in available_solvers()]
    if unknown:
        raise CkptError(f"unknown solver(s) {unknown} in --solvers; available: {', '.join(available_solvers())}")
    check_outputs([("--json", args.json_path)], inputs=model_files(args.model))
    if args.plots and os.path.exists(args.plots) and not os.path.isdir(args.plots):
        raise CkptError(f"--plots {args.plots!r} is a file; give a folder (created if missing)")
    import torch

    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with phase(f"building {args.model}"):
            wl = workload(args.model, quick=quick, options=model_options(args))
        print(f"comparing on {wl.name} ({', '.join(f'{k}={v}' for k, v in wl.meta.items())}), budgets {fractions}, "
              f"{torch.get_num_threads()} threads")
        cmp = compare(wl, fractions, solver_names=names, with_peers=not args.no_peers,
                      repeats=args.repeats or (3 if quick else 5),
                      solver_options={"ilp": {"time_limit_s": args.ilp_time_limit}}, progress=print,
                      costs=args.costs)
    finally:
        torch.set_num_threads(threads)
    print()
    print(format_table(cmp))
    if args.json_path:
        write_text_atomic(args.json_path, json.dumps(cmp.to_dict(), indent=1))
        print(f"results written to {args.json_path}")
    if args.plots:
        from ..comparing.plots import plot_comparison

        os.makedirs(args.plots, exist_ok=True)
        for path in plot_comparison(cmp, args.plots):
            print(f"plot written to {path}")
    return 0
