"""Predicted (traced graph, simulated store-all) vs measured peak of a real CPU step.

For each built-in model, transformers GPT-2 (2 layers) and a tiny Llama:
trace, simulate store-all, measure one training step with
``scheduler.measuring.storages.measure_step``; then compare granularities (nodes, solve
time, recompute overhead of the ``dp`` plan at params + grads + 50 % of the rest of the store-all peak).
Writes ``benchmarks/results/trace_memory.md``.

Run: ``python -m benchmarks.run --only trace_memory`` (``--quick``: fewer models).
"""

from __future__ import annotations

import logging
import time

import torch

import solvers
from scheduler.sizing.budget import format_bytes
from scheduler.measuring.storages import measure_step
from scheduler.models import build
from scheduler.report import table
from scheduler.tracing.tracer import capture

from benchmarks.pages import seconds, write_page

log = logging.getLogger(__name__)

MODELS = [
    ("gpt", dict(layers=4, width=128, heads=4, vocab=2000, batch=2, seq=128)),
    ("resnet", dict(depth=26, width=16, batch=2, image_size=64)),
    ("unet", dict(levels=3, width=16, image_size=64)),
    ("vgg19", dict(width=16, hidden=512, image_size=64)),
    ("hf:gpt2", dict(layers=2, seq=64)),
    ("hf:llama-tiny", dict(seq=64)),
]


def _opts(o: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in o.items())


def memory_table(models) -> list[tuple]:
    rows = []
    for name, opts in models:
        torch.manual_seed(0)
        ex = build(name, **opts)
        t0 = time.perf_counter()
        traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op")
        trace_s = time.perf_counter() - t0
        measured = measure_step(ex.model, ex.args, ex.kwargs, loss=ex.loss).peak_bytes
        for gran in ("op", "fold", 3):
            g = traced.regroup(gran).graph
            predicted = solvers.simulate(g).peak_bytes
            rows.append((name, _opts(opts), traced.method, gran, len(g), format_bytes(predicted),
                         format_bytes(measured), f"{100 * (predicted - measured) / measured:+.2f}%", f"{trace_s:.1f}s"))
    return rows


def granularity_table(name: str, opts: dict, fraction: float = 0.5) -> list[tuple]:
    torch.manual_seed(0)
    ex = build(name, **opts)
    traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op")
    rows = []
    solver = "dp" if "dp" in solvers.available_solvers() else "uniform"
    for gran in ("op", "fold", 4, 3, 2):
        g = traced.regroup(gran).graph
        base = 2 * g.param_bytes + g.input_bytes
        budget = int(base + fraction * (solvers.store_all_peak(g).peak_bytes - base))
        t0 = time.perf_counter()
        try:
            plan = solvers.solve(g, budget, solver=solver)
            sim = solvers.simulate(g, plan)
            cell = (f"{100 * sim.recompute_ratio:.1f}%", seconds(sim.recompute_time_s), format_bytes(sim.peak_bytes))
        except solvers.InfeasibleBudget:
            cell = ("infeasible", "-", "-")
        rows.append((gran, len(g), solver, f"{time.perf_counter() - t0:.2f}s", *cell, format_bytes(budget)))
    return rows


def main(quick: bool = False) -> None:
    models = MODELS[:2] + MODELS[4:5] if quick else MODELS
    rows = memory_table(models)
    mem = table(rows, ["model", "options", "tracer", "granularity", "nodes", "predicted", "measured", "error", "trace"])
    gname, gopts = ("gpt", dict(layers=12, width=256, heads=4, vocab=2000, batch=4, seq=256))
    if quick:
        gopts = dict(gopts, layers=2)
    gran = table(granularity_table(gname, gopts), ["granularity", "nodes", "solver", "solve time",
                                                    "recompute FLOPs", "recompute time", "peak",
                                                    "budget (params+grads + 50% of the rest)"])
    text = ("Predicted: `solvers.model.simulate` store-all peak of the traced graph. Measured: peak of live tensor "
            "storages in one real CPU training step (`scheduler.measuring.storages.measure_step`).\n\n"
            f"```\n{mem}\n```\n\n"
            f"## Granularity ({gname} {_opts(gopts)})\n\n"
            "Recompute: the plan's recompute FLOPs over the step's, and its predicted recompute time (the roofline "
            "cost at the graph's rate: what the solver minimises).\n\n"
            f"```\n{gran}\n```\n")
    path = write_page("trace_memory.md", "Traced graphs: predicted vs measured memory", text, quick=quick)
    log.info("wrote %s", path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
