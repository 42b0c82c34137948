"""``ckpt fit MODEL --device-memory 24GiB``: the largest batch or sequence per solver."""

from __future__ import annotations

import argparse
import sys

from solvers import format_bytes

from ..sizing.budget import OPTIMIZER_STATES
from ..sizing.memory import DEFAULT_RESERVE, NothingFits, render_report
from ..report import table
from .common import add_model_flags, positive_float, positive_int

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
torch.device("meta"), and one without `dtype` is sized in fp32 only.

Exit status 0 when some solver fits, 1 when nothing fits (the numbers and
the levers that would help are printed), 2 on errors.

examples:
  ckpt fit gpt --device-memory 2GiB --seq 256 --optimizer adam
  ckpt fit hf:llama-2-7b --device-memory 80GiB --dtype bf16 --search none --batch 1 --seq 4096
  ckpt fit hf:gpt2-xl --device-memory 24GiB --mixed-precision --search seq --batch 4"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="built-in name, hf:NAME, a config.json path, or package.module:factory")
    p.add_argument("--device-memory", "-m", required=True, help="the card's memory: 24GiB, 80GiB, 2GiB...")
    p.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZER_STATES),
                   help="optimizer whose state is kept (default adam: two states per parameter)")
    p.add_argument("--mixed-precision", action="store_true",
                   help="low-precision weights with an fp32 master copy and fp32 optimizer state (ZeRO's 16 bytes/param)")
    p.add_argument("--solver", "-s", action="append",
                   help="solver to search with (repeatable or comma-separated; default: store-all and the registered "
                        "chen, per-module, dp; 'all' for every registered solver)")
    p.add_argument("--search", default="batch", choices=["batch", "seq", "none"],
                   help="the dimension to search; 'none' only checks --batch and --seq (default batch)")
    add_model_flags(p, ("dtype", "batch", "seq"), helps={
        "dtype": "dtype of weights and activations: fp32, bf16, fp16 (or float32, bfloat16, float16); default fp32, "
                 "or bf16 with --mixed-precision",
        "batch": "batch size (fixed unless searched; default 1)",
        "seq": "sequence length (fixed unless searched; default: the model's)"})
    p.add_argument("--max-size", type=positive_int, default=None, help="largest size to try (default: the model's limit, else 4096)")
    p.add_argument("--multiple-of", type=positive_int, default=None,
                   help="try only multiples of this (default 1 for batch, 64 for seq)")
    p.add_argument("--reserve", default=None,
                   help=f"held back for the CUDA context and fragmentation: a share (5%%, 0.1) or a size (2GiB); "
                        f"default {100 * DEFAULT_RESERVE:.0f}%%")
    p.add_argument("--time-limit", type=positive_float, default=10.0, help="time limit per ilp solve, seconds (default 10)")


def _solvers(args: argparse.Namespace) -> list[str] | None:
    if not args.solver:
        return None
    names = [s.strip() for arg in args.solver for s in arg.split(",") if s.strip()]
    if "all" in names:
        import solvers

        return ["store-all"] + [s for s in solvers.available_solvers() if s != "store-all"]
    return names


def _progress(probe) -> None:
    if probe.phase == "report":
        return
    if probe.fits:
        what = f"fits, peak {format_bytes(probe.peak_bytes)}"
        if probe.solver != "store-all":
            what += f", recompute +{100 * (probe.recompute_ratio or 0):.1f}%"
    else:
        what = "does not fit" + (f" (needs {format_bytes(probe.min_feasible_bytes)})" if probe.min_feasible_bytes else "")
    print(f"  [{probe.phase}] {probe.solver} at {probe.size}: {what}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..sizing.search import fit

    dtype = args.dtype or ("bf16" if args.mixed_precision else "fp32")
    search = args.search
    dim = "batch" if search == "none" else search
    batch = args.batch or 1
    multiple = args.multiple_of or (64 if search == "seq" else 1)
    kwargs = dict(optimizer=args.optimizer, dtype=dtype, mixed_precision=args.mixed_precision,
                  reserve=args.reserve, progress=_progress,
                  solver_options={"ilp": {"time_limit_s": args.time_limit}})
    if search == "none":
        kwargs.update(min_size=batch, max_size=batch, multiple_of=1)
    else:
        kwargs.update(max_size=args.max_size, multiple_of=multiple)
    print(f"ckpt fit {args.model}: {dtype}{' mixed precision' if args.mixed_precision else ''}, "
          f"optimizer {args.optimizer}, card {args.device_memory}; searching {search if search != 'none' else 'nothing'}"
          " (progress on stderr)", flush=True)
    try:
        res = fit(args.model, args.device_memory, search=dim, batch=batch, seq=args.seq,
                  solvers=_solvers(args), **kwargs)
    except NothingFits as exc:
        print(render_report(exc.report))
        print()
        print(str(exc).split(" What would help:")[0])
        print("What would help:")
        for lever in exc.levers:
            print(f"  - {lever}")
        return 1
    print(render_report(res.report))
    print()
    if search == "none":
        size = res.report.size
        print(f"at {', '.join(f'{k} {v}' for k, v in size.items())}:")
    rows = []
    for r in res.results:
        if r.size is None:
            rows.append((r.solver, "no" if search == "none" else "none fits", "", "", len(r.probes)))
            continue
        total = r.peak_bytes + res.report.state.outside_simulation_bytes + res.report.reserve_bytes
        largest = "yes" if search == "none" else f"{r.size}{'+' if r.capped else ''}"
        rows.append((r.solver, largest, format_bytes(total), f"+{100 * (r.recompute_ratio or 0):.1f}%", len(r.probes)))
    head = "fits" if search == "none" else f"largest {dim}"
    print(table(rows, ["solver", head, "step total on card", "recompute", "sizes tried"]))
    capped = [r.solver for r in res.results if r.capped and search != "none"]
    if capped:
        print(f"('+': {', '.join(capped)} reached the largest size tried; raise --max-size to look further)")
    print(f"{res.traces} traces, {res.elapsed_s:.1f}s")
    return 0
