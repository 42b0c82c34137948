"""Every lever on every third-party model: regions, kept ops, nested regions, a chunked head (issue 33).

The models are ``benchmarks/thirdparty_models.py``'s, built by their libraries
(transformers, timm, torchvision, diffusers, peft, monai,
segmentation_models_pytorch), and each step is ``benchmarks.thirdparty``'s: the
user's own loop (``held``: ``out = model(**batch); out.loss.backward()``) from
one seed, under the profiler (``scheduler.measuring.profiler``: what "fits"
means), compared with the unplanned step. For each model, one plan per lever:

* ``regions``: one-level regions that keep no op inside them
  (``scheduler.solve(..., selective=False)``);
* ``kept``: the default, regions and the ops they keep (``ilp``);
* ``nested``: regions nested one level (``nested=True``);
* ``chunked``: the LM head and its loss in ``chunks=(1, 2, 4, 8)`` and the
  row-wise calls (MLPs) in ``mlp_chunks=(1, 2)``; a model with no row-wise
  call says so (``ChunkError``) in its row, which is not a failure.

Each is solved at half the model's store-all activations, or at that lever's
least feasible budget when it is higher, for the held loop, applied onto the
model (``scheduler.apply``) and run in the held loop. Gradients, loss and
buffers must be bitwise equal to the unplanned step, except for a chunked
plan, whose loss is a sum over chunks (reassociated): there the largest
relative difference (``max |a - b| / max |b|`` per tensor) must be at most
``TOLERANCE``.

Run with a venv that has the libraries (README, "Third-party models")::

    PYTHONPATH=. /tmp/tpvenv/bin/python -m benchmarks.levers [MODEL ...]
    python -m benchmarks.run --only levers          # --quick: gpt2 only

Writes ``benchmarks/results/levers.md`` and ``levers.json`` when every model
was asked for and none was skipped (named models: the table is printed only).
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from typing import Any

import torch
from torch import nn

import scheduler
import solvers
from scheduler.tracing.tracer import EvalModeWarning
from scheduler.applying.chunked import ChunkedHeadError
from solvers.model.chunks import ChunkError

from .thirdparty import FRACTION, SEED, Step, _step, command_line, run_suite
from .thirdparty_models import LOSS_NAMES, Case

log = logging.getLogger(__name__)

#: The levers, and the options each passes to ``scheduler.solve``.
LEVERS: dict[str, dict[str, Any]] = {
    "regions": {"selective": False},
    "kept": {},
    "nested": {"nested": True},
    "chunked": {"chunks": (1, 2, 4, 8), "mlp_chunks": (1, 2)},
}
#: A chunked loss is a reassociated sum: the largest relative difference allowed against the unplanned step.
TOLERANCE = 1e-5
TIME_LIMIT_S = 20
LOOP = "held"
#: A row whose plan ``scheduler.apply`` refused in one line (a chunked head on a model whose loss it cannot run).
REFUSED = "refused by apply"


def _solve(graph: Any, budget: int, options: dict[str, Any]) -> tuple[Any, int]:
    """The lever's plan at ``budget``, or at its least feasible budget when ``budget`` is below it."""
    at = budget
    for _ in range(3):  # a least feasible budget that does not solve is retried at the one it names
        try:
            return scheduler.solve(graph, at, solver="ilp", time_limit_s=TIME_LIMIT_S, **options), at
        except solvers.InfeasibleBudget as exc:
            if exc.min_feasible_bytes is None or exc.min_feasible_bytes <= at:
                raise
            at = exc.min_feasible_bytes
    return scheduler.solve(graph, at, solver="ilp", time_limit_s=TIME_LIMIT_S, **options), at


def _uses(plan: Any) -> str:
    """What the plan uses: regions, kept ops, inner regions, chunked calls (with their counts)."""
    parts = [f"{len(plan.regions)} regions", f"{len(plan.saved)} kept", f"{len(plan.inner)} inner"]
    ks = [k for _, _, k in plan.chunks]
    parts.append(f"{len(ks)} chunked" + (f" (x{', x'.join(str(k) for k in ks)})" if ks else ""))
    return ", ".join(parts)


def _max_relative(a: Step, b: Step) -> float:
    """Largest ``max |x - y| / scale`` over loss, gradients and buffers (inf where one is None and not the other):
    ``scale`` is ``max |y|`` of the loss and of each buffer, and the largest gradient of the step for every
    gradient. A gradient that is zero in exact arithmetic (an attention key's bias: softmax ignores a shift of
    the keys; 6e-11 on diffusers' UNet) differs by rounding alone, and against its own size read 1.8."""
    worst = 0.0
    pairs = [(a.loss, b.loss), *zip(a.grads, b.grads), *zip(a.buffers, b.buffers)]
    if len(a.grads) != len(b.grads) or len(a.buffers) != len(b.buffers):
        return float("inf")
    grads = {id(y) for y in b.grads if y is not None}
    top = max((y.abs().max().item() for y in b.grads if y is not None and y.is_floating_point() and y.numel()),
              default=0.0)
    for x, y in pairs:
        if x is None or y is None:
            if (x is None) != (y is None):
                return float("inf")
            continue
        if x.shape != y.shape:
            return float("inf")
        if not x.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(x, y) else float("inf"))
            continue
        scale = top if id(y) in grads else y.abs().max().item()
        diff = (x.double() - y.double()).abs().max().item()
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")))
    return worst


def _lever(model: nn.Module, graph: Any, lever: str, budget: int, batch: tuple, loss: Any,
           buffers: list[torch.Tensor], plain: Step) -> dict:
    """One lever's plan solved, applied, run once in the held loop, and measured."""
    row: dict[str, Any] = {"lever": lever}
    t0 = time.perf_counter()
    try:
        plan, at = _solve(graph, budget, LEVERS[lever])
    except ChunkError as exc:
        if lever != "chunked":  # a chunk error from a solve that chunks nothing is a failure
            raise
        return {**row, "status": "no row-wise call", "note": str(exc).splitlines()[0][:200]}
    row.update(budget=at, solve_s=round(time.perf_counter() - t0, 1), status=str(plan.status), uses=_uses(plan))
    if plan.findings.get("chunks_skipped"):
        row["note"] = f"skipped: {plan.findings['chunks_skipped']}"[:200]
    # a chunked plan's positions are its expanded graph's: its own simulated peak is the prediction
    row["predicted"] = plan.peak_bytes if plan.chunks else \
        solvers.simulate(graph.with_loop(LOOP), plan, record=False).peak_bytes
    t1 = time.perf_counter()
    try:
        scheduler.apply(model, plan)
    except ChunkedHeadError as exc:  # refused at once, in one line: not a failure, but solve let the plan through
        return {**row, "status": REFUSED, "note": str(exc).splitlines()[0][:200]}
    try:
        step = _step(model, LOOP, batch, loss, buffers)
    finally:
        scheduler.remove(model)
    row.update(step_s=round(time.perf_counter() - t1, 1), allocator=step.peak_bytes, plain_allocator=plain.peak_bytes)
    if plan.chunks:
        row["max_relative"] = _max_relative(step, plain)
        row["same"] = row["max_relative"] <= TOLERANCE
    else:
        row["same"] = step.same_as(plain)
    return row


def run_case(name: str, case: Case) -> dict:
    """Every lever on one model, built and put in training mode before it is traced."""
    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    model = case.build().train()
    args, kwargs, target = case.inputs()
    batch = (args, kwargs)

    def loss(out: Any) -> torch.Tensor:
        return case.loss(out, target)

    graph = scheduler.trace(model, args, kwargs, loss=loss)  # the held loop (the default)
    budget = solvers.activation_budget_bytes(graph, FRACTION)
    buffers = [b.detach().clone() for b in model.buffers()]
    plain = _step(model, LOOP, batch, loss, buffers)
    rows = []
    for lever in LEVERS:
        log.info("levers: %s %s", name, lever)
        try:
            rows.append(_lever(model, graph, lever, budget, batch, loss, buffers, plain))
        except Exception as exc:  # a lever that breaks on a model is a result to report, not a crash
            log.exception("levers: %s %s failed", name, lever)
            rows.append({"lever": lever, "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]})
        log.info("%s", rows[-1])
    return {"model": name, "library": case.library, "class": type(model).__name__, "loss": LOSS_NAMES[case.loss],
            "nodes": len(graph), "store_all": solvers.simulate(graph, record=False).peak_bytes,
            "half_budget": budget, "levers": rows, "seconds": round(time.perf_counter() - t0, 1)}


# ----------------------------------------------------------------------- report
TITLE = "Every lever on every third-party model"


def _b(v: int) -> str:
    return f"{v:,}"


def report(models: list[dict], skipped: list[str]) -> str:
    """The page below its title and header (``benchmarks.pages``)."""
    rows = [(m, x) for m in models if "error" not in m for x in m["levers"]]
    measured = [(m, x) for m, x in rows if "allocator" in x]
    under = sum(x["allocator"] <= x["predicted"] for _, x in measured)
    fits = sum(x["allocator"] <= x["budget"] for _, x in measured)
    same = sum(x["same"] for _, x in measured)
    failed = [(m, x) for m, x in rows if x["status"] == "failed"] + [(m, None) for m in models if "error" in m]
    no_rows = sum(x["status"] == "no row-wise call" for _, x in rows)
    refused = sum(x["status"] == REFUSED for _, x in rows)
    lines = [
        f"{torch.get_num_threads()} torch threads. The models of [thirdparty.md](thirdparty.md) (each built by its "
        "library, small config, random weights, dropout or stochastic depth on, `model.train()`, traced with its "
        f"loss). Per lever one plan, solved by `ilp` (time limit {TIME_LIMIT_S} s) at {FRACTION:g} of the model's "
        "store-all activations, or at that lever's least feasible budget when higher, for the held loop "
        "(`out = model(**batch); out.loss.backward()`), applied onto the model (`scheduler.apply`) and run "
        "one step in that loop. Levers: `regions` one-level regions keeping no op (`selective=False`); `kept` the "
        "default (regions and the ops they keep); `nested` regions nested one level (`nested=True`); `chunked` "
        "`chunks=(1, 2, 4, 8)`, `mlp_chunks=(1, 2)` (the cheapest that fits wins; a model with no row-wise call "
        "says so). Predicted: `simulate` of the plan (a chunked plan: its own simulated peak on the expanded graph); "
        "allocator: the profiler's peak of the step (parameters, buffers and inputs included). Gradients: loss, "
        "gradients and buffers bitwise equal to the unplanned step from the same seed; chunked plans reassociate "
        f"the loss's sum, so there the largest relative difference (`max|a - b| / max|b|` per tensor) must be "
        f"<= {TOLERANCE:g}.", "",
        f"**{under} of {len(measured)} applied plans at or below their prediction by the allocator, {fits} of "
        f"{len(measured)} within their budget; {same} of {len(measured)} bitwise or within tolerance; "
        f"{no_rows} rows without a row-wise call, {refused} plans refused by `apply` in one line; "
        f"{len(failed)} failed.**", "",
        "| model | lever | plan uses | status | budget | predicted | allocator | allocator - predicted | fits "
        "| gradients | time |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, x in rows:
        if "allocator" not in x:
            what = x.get("error") or x.get("note", "")
            lines.append(f"| {m['model']} | {x['lever']} | | {x['status']}: {what.replace('|', '/')} "
                         "| | | | | | | |")
            continue
        grads = ("bitwise" if x["same"] else "**NO**") if "max_relative" not in x else \
            f"{'' if x['same'] else '**'}{x['max_relative']:.1e}{'' if x['same'] else '**'}"
        lines.append(f"| {m['model']} | {x['lever']} | {x['uses']} | {x['status']} | {_b(x['budget'])} "
                     f"| {_b(x['predicted'])} | {_b(x['allocator'])} | {x['allocator'] - x['predicted']:+,} "
                     f"| {'yes' if x['allocator'] <= x['budget'] else '**NO**'} | {grads} "
                     f"| {x['solve_s']} s + {x['step_s']} s |")
    lines += ["", "Time: solve + the planned step (applied, profiled). Per model:", "",
              "| model | library | class | loss | nodes | store-all (predicted) | half its activations | time |",
              "|---|---|---|---|---|---|---|---|"]
    for m in models:
        if "error" not in m:
            lines.append(f"| {m['model']} | {m['library']} | {m['class']} | `{m['loss']}` | {m['nodes']} "
                         f"| {_b(m['store_all'])} | {_b(m['half_budget'])} | {m['seconds']} s |")
    lines.append("")
    for m, x in measured:
        if x["allocator"] > x["predicted"] or x["allocator"] > x["budget"]:
            lines.append(f"- {m['model']} `{x['lever']}`: allocator {x['allocator'] - x['predicted']:+,} B against "
                         f"its prediction, {x['allocator'] - x['budget']:+,} B against its budget")
        if x.get("note"):
            lines.append(f"- {m['model']} `{x['lever']}`: {x['note']}")
    lines += [f"- {m['model']}: **failed**: {m['error']}" for m in models if "error" in m]
    lines += [f"- {line}" for line in skipped]
    return "\n".join(lines).rstrip() + "\n"


def main(quick: bool = False, names: list[str] | None = None, command: str | None = None) -> list[dict]:
    """Run the models in ``names`` (default: all, ``QUICK`` with ``quick``); write the results page."""
    return run_suite("levers", run_case, report, TITLE, "models", quick=quick, names=names, command=command)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    warnings.filterwarnings("ignore", category=EvalModeWarning)
    main(names=sys.argv[1:] or None, command=command_line("benchmarks.levers"))
