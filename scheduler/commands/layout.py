"""The parallel layout on ``ckpt solve`` and ``ckpt fit``: its flags, and what each command answers with one.

``--fsdp 8 --tp 2 --pp 4 --microbatches 8 --schedule 1f1b`` (``scheduler.distributed.Layout``): ``solve``
then plans each pipeline stage for one rank's card (``--budget``), ``fit`` searches the largest micro-batch
(or sequence) per rank on ``--device-memory`` and the smallest card, and both print each stage's rank and
write one plan per stage (``-o plan.json``: ``plan.stage0.json``... and each stage's rank graph beside it).
"""

from __future__ import annotations

import argparse
import sys

from graphs import CkptError
from solvers import format_bytes

from ..distributed.layout import SCHEDULES, Layout
from ..report import checkpoints_line, format_seconds, ratio, table
from .common import check_outputs, positive_int, solve_flag_options

__all__ = ["add_layout_arguments", "layout_from_args", "render_layout_plan", "run_solve", "run_fit"]

_FLAGS = ("fsdp", "hsdp", "tp", "sp", "pp", "microbatches", "schedule", "virtual_stages", "stages", "fsdp_units")


def add_layout_arguments(p: argparse.ArgumentParser, *, budget: str) -> None:
    """The layout flags (README: "Distributed training"); none given: one rank, as before."""
    g = p.add_argument_group("parallel layout (each rank's memory; one plan per pipeline stage)")
    g.add_argument("--fsdp", type=positive_int, default=None, metavar="N",
                   help="FSDP2 shard degree: parameters, gradients and optimizer state split over N ranks")
    g.add_argument("--hsdp", type=positive_int, default=None, metavar="R",
                   help="HSDP replicate degree (copies of each --fsdp group; a rank holds the same)")
    g.add_argument("--tp", type=positive_int, default=None, metavar="N",
                   help="tensor-parallel degree (attention heads and MLP width split over N ranks)")
    g.add_argument("--sp", action="store_true", help="sequence parallelism with --tp (norms, dropouts, residual split)")
    g.add_argument("--pp", type=positive_int, default=None, metavar="N", help="pipeline ranks")
    g.add_argument("--microbatches", type=positive_int, default=None, metavar="M",
                   help="micro-batches per step (the pipeline's; gradient accumulation without one)")
    g.add_argument("--schedule", default=None, choices=SCHEDULES, help="pipeline schedule (default 1f1b)")
    g.add_argument("--virtual-stages", type=positive_int, default=None, metavar="V",
                   help="stages per pipeline rank (interleaved-1f1b; default 2 there)")
    g.add_argument("--stages", default=None, metavar="MOD,...",
                   help="module paths where stages 1, 2, ... begin (default: balanced over the repeated blocks)")
    g.add_argument("--fsdp-units", default=None, metavar="MOD,...",
                   help="modules wrapped with their own fully_shard (default: every repeated block)")
    p.set_defaults(_layout_budget=budget)


def layout_from_args(args: argparse.Namespace) -> Layout | None:
    """The layout the flags describe, or None when none was given (checked before any work).

    Raises:
        LayoutError: a layout that cannot run (the message says which flag).
    """
    if all(getattr(args, f, None) in (None, False) for f in _FLAGS):
        return None
    schedule = args.schedule or "1f1b"
    virtual = args.virtual_stages or (2 if schedule == "interleaved-1f1b" else 1)
    split = lambda text: tuple(s.strip() for s in text.split(",") if s.strip()) if text else ()  # noqa: E731
    return Layout(shard=args.fsdp or 1, replicate=args.hsdp or 1, tp=args.tp or 1, sequence_parallel=args.sp,
                  pp=args.pp or 1, microbatches=args.microbatches or 1, schedule=schedule, virtual_stages=virtual,
                  stage_starts=split(args.stages), fsdp_units=split(args.fsdp_units))


def render_layout_plan(plans) -> str:  # noqa: ANN001  (a scheduler.distributed.LayoutPlan)
    """One row per stage: its rank, modules, micro-batches in flight, what the rank holds, its plan."""
    rows, notes = [], []
    for s in plans.stages:
        grads = s.memory.grad_bytes if s.memory is not None else 0
        outside = s.state.outside_simulation_bytes if s.state is not None else 0
        held = s.base_bytes + grads
        span = f"{s.modules[0]} .. {s.modules[1]}" if s.modules[0] != s.modules[1] else s.modules[0]
        if s.plan is None:
            rows.append((s.index, s.rank, span, s.inflight, format_bytes(held), format_bytes(outside), "", "",
                         s.no_plan_text))
        else:
            step = s.graph.total_fwd_flops() + s.graph.total_bwd_flops()
            cost = ratio((s.plan.recompute_flops or 0) / step if step else 0.0)
            if s.plan.recompute_time_s:
                cost += f", {format_seconds(s.plan.recompute_time_s)}"
            rows.append((s.index, s.rank, span, s.inflight, format_bytes(held), format_bytes(outside),
                         format_bytes((s.peak_bytes or 0) - held - outside), format_bytes(s.peak_bytes or 0),
                         f"{cost}; {checkpoints_line(s.plan)} ({s.plan.status})"))
        notes.append(f"  stage {s.index}: {s.inflight} in flight: {s.inflight_reason}")
    head = (f"{plans.layout.describe()}: one rank's card {format_bytes(plans.budget_bytes)}"
            + (f", {format_bytes(plans.reserve_bytes)} held back" if plans.reserve_bytes else ""))
    body = table(rows, ["stage", "rank", "modules", "in flight", "weights, grads, buffers", "optimizer, master",
                        "activations", "rank peak", "recompute; plan"])
    return "\n".join([head, body, "micro-batches in flight:"] + notes)


def _outputs(args: argparse.Namespace, layout: Layout, inputs: list[str]) -> None:
    """Check each file ``-o`` will write for ``layout`` before any work."""
    if args.output:
        from ..distributed.plans import plan_files

        check_outputs([("-o", path) for path in plan_files(args.output, layout.stages)], inputs=inputs)


def _write(plans, output: str | None) -> None:  # noqa: ANN001
    if output and plans is not None and plans.fits:
        names = plans.save(output)
        print(f"plans written: {', '.join(names[0::2])} (each stage's rank graph beside it: {names[1]}, ...)")


def run_solve(args: argparse.Namespace, layout: Layout) -> int:
    """``ckpt solve GRAPH --budget CARD`` with a layout: one plan per stage, each rank's memory."""
    import graphs

    from ..distributed.plans import solve_layout

    if args.solver == "all":
        raise CkptError("--solver all compares solvers on one graph; with a layout each stage is solved by one "
                        "solver: name it (default ilp)")
    name = args.solver or "ilp"
    options = solve_flag_options(name, args)
    _outputs(args, layout, [args.graph])
    graph = graphs.load(args.graph)
    if getattr(args, "loop", None):  # NOTE [ The user's loop ]: the same graph planned for another loop
        graph = graph.with_loop(args.loop)
    plans = solve_layout(graph, args.budget, layout, solver=name, optimizer=args.optimizer,
                         mixed_precision=args.mixed_precision, reserve=args.reserve or 0, strict=False, **options)
    _write(plans, args.output)
    print(render_layout_plan(plans))
    if not plans.fits:
        print("some stage has no plan on this card: a larger card, more ranks (--fsdp, --tp, --pp), fewer "
              "micro-batches in flight (--schedule 1f1b) or a smaller micro-batch")
        return 2
    return 0


def run_fit(args: argparse.Namespace, layout: Layout, model, card: str | None, *, batch: int = 1  # noqa: ANN001
            ) -> int:
    """``ckpt fit MODEL`` with a layout (``model``: a ``SizedModel`` at the micro-batch per rank): the largest
    micro-batch (or sequence) per rank, the stage plans there and the smallest card."""
    from ..distributed.fit import fit_layout

    _outputs(args, layout, [])
    def progress(size: int, fits: bool) -> None:
        print(f"  {model.dimension} {size}: {'fits' if fits else 'does not fit'}", file=sys.stderr, flush=True)

    names = [s for s in (args.solver or []) for s in s.split(",") if s.strip() and s.strip() != "store-all"]
    if len(names) > 1:
        raise CkptError(f"with a layout each stage is solved by one solver; name one, not {', '.join(names)}")
    search = args.search
    res = fit_layout(model, card, layout, optimizer=args.optimizer, mixed_precision=args.mixed_precision,
                     reserve=args.reserve, solver=names[0] if names else "ilp",
                     min_size=batch if search == "none" else 1,
                     max_size=batch if search == "none" else args.max_size,
                     multiple_of=1 if search == "none" else args.multiple_of or (64 if search == "seq" else 1),
                     solver_options={"time_limit_s": args.time_limit}, progress=progress)
    if res.plans is not None:
        _write(res.plans, args.output)
        print(render_layout_plan(res.plans))
    print()
    what = "micro-batch per rank" if res.dimension == "batch" else "sequence"
    fixed = ", ".join(f"{k} {v}" for k, v in res.fixed.items())
    if card is not None and search != "none":
        if res.size is None:
            print(f"largest {what} on {card}: none fits ({fixed})")
        else:
            print(f"largest {what} on {card}: {res.size}{'+' if res.capped else ''} ({fixed}; global batch "
                  f"{res.size * layout.data_parallel * layout.microbatches if res.dimension == 'batch' else 'as set'})")
    if res.card is not None:
        at = f"{res.dimension} {res.size}" if res.size is not None else "the smallest size"
        if res.card.card_bytes is None:
            print(f"smallest card at {at}: none found up to {format_bytes(res.card.below_bytes)}")
        else:
            print(f"smallest card at {at}: {format_bytes(res.card.card_bytes)} per rank (fits; "
                  f"{format_bytes(res.card.below_bytes)} does not)")
    print(f"{res.traces} traces, {res.elapsed_s:.1f}s")
    fits = res.plans is not None and res.plans.fits
    return 0 if fits else 1
