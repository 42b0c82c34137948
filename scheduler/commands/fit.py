"""``ckpt fit MODEL --device-memory 24GiB``: the largest batch or sequence per solver."""

from __future__ import annotations

import argparse
import sys

from graphs import CkptError
from solvers import format_bytes

from ..report import checkpoints_line, describe_target, format_seconds, status_text, table
from ..sizing.memory import DEFAULT_RESERVE, NothingFits, parse_reserve, render_report
from ..sizing.search import DEFAULT_SOLVERS
from .layout import add_layout_arguments, layout_from_args, run_fit as run_layout_fit
from .common import (add_loop_flag, add_model_arguments, add_step_flags, add_target_flag, check_outputs, model_files,
                     model_options, positive_float, positive_int, solver_flag_options)

NAME = "fit"
HELP = "the largest batch or sequence that fits a card, per solver, and the step's memory by category"
DESCRIPTION = f"""Answer "my card has 24 GiB: what batch (or sequence) can I train, and what
does it cost?" The step's persistent state (weights, gradients, optimizer
state, the fp32 master copy under mixed precision, and a reserve for the CUDA
context and allocator fragmentation, default {100 * DEFAULT_RESERVE:.0f}% of the card) is
subtracted from the card; each solver then plans activations against what is
left, at every size the search tries (galloping, then bisection; the model is
re-traced at each size).

MODEL: a built-in example (`ckpt models`), hf:NAME (a named published shape
such as hf:llama-2-7b, or a transformers model type), a path to a local
config.json, or package.module:factory. hf models are built on the meta
device: nothing is allocated, so a 13B fine-tune is sized from a laptop. A
factory gets `batch` (and `seq` when searched), `dtype` and `device="meta"`
only when it takes them; one without a device option runs under
torch.device("meta"), and one without `dtype` is sized in fp32 only. The
model's other options are the flags and -O KEY=VALUE `ckpt trace` takes.

The solvers are store-all, ilp, dp, chen and per-module unless --solver
says. One that stops without an answer at a size (its time limit, an error)
does not fit there; the table says where and why, and the other answers
stand. The plan reported is the one at the largest size, then the least
recompute, then the first solver (ilp), or --plan-solver's; -o writes it,
with the model and its options at that size, for `ckpt apply PLAN`.

Exit status 0 when some solver fits, 1 when nothing fits (the numbers and
the levers that would help are printed), 2 on errors.

examples:
  ckpt fit gpt --device-memory 2GiB --seq 256 --optimizer sgd
  ckpt fit gpt --layers 4 -O vocab=8192 --seq 256 --device-memory 1GiB -o plan.json && ckpt apply plan.json
  ckpt fit hf:llama-2-7b --device-memory 80GiB --dtype bf16 --search none --batch 1 --seq 4096
  ckpt fit hf:gpt2-xl --device-memory 24GiB --mixed-precision --search seq --batch 4"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, model_help="built-in name, hf:NAME, a config.json path, or package.module:factory", helps={
        "dtype": "dtype of weights and activations: fp32, bf16, fp16 (or float32, bfloat16, float16); default fp32, "
                 "or bf16 with --mixed-precision",
        "batch": "batch size (fixed unless searched; default 1)",
        "seq": "sequence length (fixed unless searched; default: the model's)",
        "device": "refused: fit builds every model on the meta device (shapes only)"})
    p.add_argument("--device-memory", "-m", required=True, help="the card's memory: 24GiB, 80GiB, 2GiB...")
    add_target_flag(p)
    add_step_flags(p, optimizer="adam", reserve=f"{100 * DEFAULT_RESERVE:.0f}%%", budget="card")
    p.add_argument("--solver", "-s", action="append",
                   help="solver to search with (repeatable or comma-separated; default: store-all and the registered "
                        f"{', '.join(s for s in DEFAULT_SOLVERS if s != 'store-all')}; 'all' for every registered solver)")
    p.add_argument("--search", default="batch", choices=["batch", "seq", "none"],
                   help="the dimension to search; 'none' only checks --batch and --seq (default batch)")
    p.add_argument("--max-size", type=positive_int, default=None, help="largest size to try (default: the model's limit, else 4096)")
    p.add_argument("--multiple-of", type=positive_int, default=None,
                   help="try only multiples of this (default 1 for batch, 64 for seq)")
    add_loop_flag(p)
    p.add_argument("--time-limit", type=positive_float, default=10.0,
                   help="wall-clock seconds per solve for the solvers that take a limit (ilp, cp-sat, frontier, dp; default 10)")
    p.add_argument("-o", "--output", help="write the plan fit reports here (JSON; see --plan-solver), for `ckpt apply`")
    p.add_argument("--plan-solver", default=None, metavar="NAME",
                   help="the solver whose plan is reported and written (default: the one that fits the largest size, "
                        "then the least recompute, then the first asked: ilp by default)")
    add_layout_arguments(p, budget="card")


def _solvers(args: argparse.Namespace) -> list[str]:
    import solvers

    if not args.solver:
        return [s for s in DEFAULT_SOLVERS if s == "store-all" or s in solvers.available_solvers()]
    names = [s.strip() for arg in args.solver for s in arg.split(",") if s.strip()]
    if "all" in names:
        return ["store-all"] + [s for s in solvers.available_solvers() if s != "store-all"]
    for name in names:
        if name != "store-all":
            solvers.get_solver(name)  # an unknown name is an error before any work
    return list(dict.fromkeys(names))


def _progress(probe) -> None:
    if probe.phase == "report":
        return
    if probe.fits:  # the table's figure, by the table's name (issue 33: "peak" here, "step total" there)
        what = f"fits, step total on card {format_bytes(probe.peak_bytes + probe.card_extra_bytes)}"
        if probe.solver != "store-all":
            what += f", recompute +{100 * (probe.recompute_ratio or 0):.1f}%"
    elif probe.stop:
        what = probe.stop
    else:
        what = "does not fit" + (f" (needs {format_bytes(probe.min_feasible_bytes + probe.card_extra_bytes)} card)"
                                 if probe.min_feasible_bytes else "")
    print(f"  [{probe.phase}] {probe.solver} at {probe.size}: {what}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..sizing.fit import fit

    options = model_options(args)
    batch, seq = options.pop("batch", 1), options.pop("seq", None)
    dtype = options.pop("dtype", None) or ("bf16" if args.mixed_precision else "fp32")
    if "device" in options:
        raise CkptError("ckpt fit builds every model on the meta device (shapes only, for a card this machine need "
                        "not have); drop --device")
    layout = layout_from_args(args)
    if layout is not None:  # the micro-batch per rank, the stage plans, the smallest card (commands.layout)
        from ..sizing.sized import sized_model

        model = sized_model(args.model, search="batch" if args.search == "none" else args.search, batch=batch,
                            seq=seq, dtype=dtype, options=options, target=args.target,
                            loop=args.loop)
        return run_layout_fit(args, layout, model, args.device_memory, batch=batch)
    names = _solvers(args)
    if args.plan_solver is not None and args.plan_solver not in names:
        raise CkptError(f"--plan-solver {args.plan_solver}: not among the solvers searched ({', '.join(names)})")
    if args.reserve is not None:
        parse_reserve(args.reserve, 1 << 62)  # a malformed reserve is an error before any work
    check_outputs([("-o", args.output)], inputs=model_files(args.model))
    search = args.search
    dim = "batch" if search == "none" else search
    multiple = args.multiple_of or (64 if search == "seq" else 1)
    limits = {"--time-limit": ("time_limit_s", args.time_limit)}
    kwargs = dict(optimizer=args.optimizer, dtype=dtype, mixed_precision=args.mixed_precision,
                  reserve=args.reserve, progress=_progress,
                  solver_options={n: solver_flag_options(n, limits, (), strict=False) for n in names if n != "store-all"})
    if search == "none":
        kwargs.update(min_size=batch, max_size=batch, multiple_of=1)
    else:
        kwargs.update(max_size=args.max_size, multiple_of=multiple)
    print(f"ckpt fit {args.model}: {dtype}{' mixed precision' if args.mixed_precision else ''}, "
          f"optimizer {args.optimizer}, card {args.device_memory}; searching {search if search != 'none' else 'nothing'}"
          " (progress on stderr)", flush=True)
    print(assumptions(args), flush=True)
    try:
        res = fit(args.model, args.device_memory, search=dim, batch=batch, seq=seq, solvers=names, options=options,
                  target=args.target, loop=args.loop, **kwargs)
    except NothingFits as exc:
        print(render_report(exc.report))
        print()
        print(str(exc).split(" What would help:")[0])
        print("What would help:")
        for lever in exc.levers:
            print(f"  - {lever}")
        if args.output:
            print(f"no plan written ({args.output} left as it was)")
        return 1
    chosen = res.result(args.plan_solver) if args.plan_solver else res.best()
    if args.output and chosen is not None and chosen.plan is not None:
        chosen.plan.save(args.output)  # before printing: a closed stdout must not lose the plan
    print(render_report(res.report))
    print(f"planned for: {describe_target(res.target)}")
    print()
    if search == "none":
        size = res.report.size
        print(f"at {', '.join(f'{k} {v}' for k, v in size.items())}:")
    rows = []
    for r in res.results:
        note = r.stop if r.stop else ""
        if r.size is None:
            rows.append((r.solver, "no" if search == "none" else "none fits", "", "", "", len(r.probes), note))
            continue
        total = r.peak_bytes + res.report.state.outside_simulation_bytes + res.report.reserve_bytes
        largest = "yes" if search == "none" else f"{r.size}{'+' if r.capped else ''}"
        seconds = r.plan.recompute_time_s if r.plan is not None else None
        rows.append((r.solver, largest, format_bytes(total), f"+{100 * (r.recompute_ratio or 0):.1f}%",
                     "" if seconds is None else format_seconds(seconds) if seconds else "0", len(r.probes), note))
    head = "fits" if search == "none" else f"largest {dim}"
    stopped = any(r.stop for r in res.results)
    print(table([r if stopped else r[:-1] for r in rows],
                ["solver", head, "step total on card", "recompute FLOPs", "recompute time", "sizes tried",
                 "stopped"][:7 if stopped else 6]))
    capped = [r.solver for r in res.results if r.capped and search != "none"]
    if capped:
        print(f"('+': {', '.join(capped)} reached the largest size tried; raise --max-size to look further)")
    if stopped:
        print("(stopped: the solver gave no answer at that size, so a larger one may fit; raise --time-limit)")
    _report_plan(chosen, dim, args.output)
    print(f"{res.traces} traces, {res.elapsed_s:.1f}s")
    return 0


def assumptions(args: argparse.Namespace) -> str:
    """What fit assumes that the user may not have said (issue 33: a CPU model was sized for Adam on an H100
    without a word): the optimizer whose state it counts and the device it plans for."""
    from ..tracing.roofline import DEFAULT_DEVICE

    given = set(getattr(args, "_argv", None) or ())
    opt = args.optimizer
    opt_text = (f"optimizer {opt}'s state counted" if opt not in (None, "none") else "no optimizer state counted")
    if "--optimizer" not in given and not any(a.startswith("--optimizer=") for a in given):
        opt_text += " (the default; --optimizer sgd, adamw, none...)"
    if args.target:
        target_text = f"planned for --target {args.target}"
    else:
        target_text = (f"planned for cuda = {DEFAULT_DEVICE} (the default for a model built on the meta device; "
                       "--target cpu to size it for this machine, which `ckpt apply --verify` can check here)")
    return f"assuming: {opt_text}; {target_text}"


def _report_plan(chosen, dim: str, output: str | None) -> None:  # noqa: ANN001
    """The plan fit reports: whose, at which size, what it checkpoints, and where it was written."""
    if chosen is None or chosen.plan is None:
        print(f"plan: {chosen.solver if chosen else 'none'} fits no size" + (f"; nothing written to {output}" if output else ""))
        return
    print(f"plan: {chosen.solver} at {dim} {chosen.size} ({status_text(chosen.plan)}), {checkpoints_line(chosen.plan)}")
    if output:
        print(f"plan written to {output} (ckpt apply {output})")
