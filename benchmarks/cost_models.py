"""How well each cost model predicts the time a plan's recompute takes, on this CPU.

For the built-in gpt (width 768, 4 layers, sequence 256, batch 2), resnet and
unet: trace once with roofline costs (NOTE [ Roofline costs ] in
``scheduler.tracing.roofline``), measure every fx node's forward time
(``torch.fx.Interpreter``, median of ``REPEATS`` runs, as
``scheduler.tracing.timing`` does), and for a few plans (one region per block,
and ``ilp`` plans at three budgets, solved once on roofline costs and once
on FLOPs) compare the recompute time each model predicts with the measured
time of the recomputed nodes:

* roofline: the plan's roofline cost at the graph's rate;
* FLOPs: its recomputed FLOPs at the CPU's measured float32 peak;
* time (noise floor): per-node times from a second, independent measurement.

Each model's error is the mean over the plans of |predicted - measured| /
measured. The solvers only compare costs, so a model that is off by one
factor everywhere (a slower or busier machine than when the CPU was
calibrated) picks the same plans: the "shape" errors first scale each
model's predictions by the one factor that makes its whole-forward
prediction equal the measured forward, and then compare.

torch runs on one thread: the machine these numbers come from is shared,
and two threads contending with other processes made an ``add`` of 1.5 MB
take 8 ms (one thread: under 1 ms).

Writes ``benchmarks/results/cost_models.md`` (and ``.json``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import sys

import torch

import solvers
from scheduler.models import build
from scheduler.tracing.tracer import capture
from scheduler.tracing.calibration import cpu_peaks
from scheduler.tracing.timing import measure_node_times
from solvers import InfeasibleBudget, Plan, activation_budget_bytes

from benchmarks.pages import out_dir, write_page

log = logging.getLogger("benchmarks.cost_models")
REPEATS = 7
FRACTIONS = (0.4, 0.6, 0.8)
MODELS = {
    "gpt": dict(layers=4, width=768, heads=12, seq=256, batch=2, vocab=8192),
    "resnet": dict(),
    "unet": dict(),
}
QUICK = {
    "gpt": dict(layers=2, width=128, heads=4, seq=64, batch=2, vocab=512),
    "resnet": dict(image_size=32),
    "unet": dict(image_size=32),
}


def _plans(graph, flops_graph) -> dict[str, Plan]:
    """Named plans over ``graph``: per block, and ilp on each objective at a few budgets."""
    plans = {"per-module": solvers.solve(graph, 2**62, solver="per-module")}
    for f in FRACTIONS:
        budget = activation_budget_bytes(graph, f)
        for tag, g in (("roofline", graph), ("flops", flops_graph)):
            try:
                plans[f"ilp {f:g} ({tag} objective)"] = solvers.solve(g, budget, solver="ilp", time_limit_s=30)
            except InfeasibleBudget:
                log.info("no plan at %g of store-all", f)
    return plans


def _measured_s(graph, members, times_ns: dict[str, int], regions) -> float:
    ns = 0
    for a, b in regions:
        for i in range(a, b + 1):
            ns += sum(times_ns.get(m, 0) for m in members[i])
    return ns / 1e9


def run_model(name: str, options: dict) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ex = build(name, **options)
    ex.model.train()
    traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, name=name)
    graph = traced.graph
    rate = graph.meta["costs"]["flops_per_s"]
    cpu = cpu_peaks()
    flops_rate = cpu.peak("float32")
    flops_graph = graph.with_nodes([dataclasses.replace(nd, fwd_cost=nd.fwd_flops) for nd in graph.nodes])
    flat = traced.flatten_inputs(*ex.args, **dict(ex.kwargs))
    times = measure_node_times(traced.gm, flat, repeats=REPEATS, warmup=2)
    again = measure_node_times(traced.gm, flat, repeats=REPEATS, warmup=2)  # the noise floor
    rows = []
    everything = [(0, len(graph) - 1)]
    for label, plan in [("whole forward", Plan(regions=()))] + list(_plans(graph, flops_graph).items()):
        regions = everything if label == "whole forward" else plan.regions
        idx = [i for a, b in regions for i in range(a, b + 1)]
        measured = _measured_s(graph, traced.members, times, regions)
        rows.append({
            "plan": label, "regions": len(plan.regions), "nodes": len(idx),
            "measured_ms": 1e3 * measured,
            "roofline_ms": 1e3 * sum(graph.nodes[i].fwd_cost for i in idx) / rate,
            "flops_ms": 1e3 * sum(graph.nodes[i].fwd_flops for i in idx) / flops_rate,
            "time_ms": 1e3 * _measured_s(graph, traced.members, again, regions),
        })
    errors, shape = {}, {}
    for key in ("roofline", "flops", "time"):
        scale = rows[0]["measured_ms"] / rows[0][f"{key}_ms"]
        plans = [r for r in rows[1:] if r["measured_ms"] > 0]
        errors[key] = statistics.fmean(abs(r[f"{key}_ms"] - r["measured_ms"]) / r["measured_ms"] for r in plans)
        shape[key] = statistics.fmean(abs(scale * r[f"{key}_ms"] - r["measured_ms"]) / r["measured_ms"] for r in plans)
    return {"model": name, "options": options, "nodes": len(graph), "device": graph.meta["costs"]["device"],
            "rows": rows, "mean_rel_error": errors, "shape_error": shape}


def main(quick: bool = False) -> None:
    torch.set_num_threads(1)
    cpu = cpu_peaks()
    results = [run_model(name, (QUICK if quick else MODELS)[name]) for name in MODELS]
    lines = [f"{torch.get_num_threads()} torch thread(s). CPU peaks (measured, cached): "
             f"float32 {cpu.peak('float32') / 1e9:.3g} GFLOP/s, copy {cpu.bytes_per_s / 1e9:.3g} GB/s, "
             f"{cpu.op_overhead_s * 1e6:.2g} us per op.", "",
             "Measured: the recomputed nodes' forward times (fx Interpreter, median of "
             f"{REPEATS} runs). roofline: the plan's roofline cost at the graph's rate; FLOPs: its FLOPs at the "
             "float32 peak; time: the same nodes in a second, independent measurement (the noise floor). "
             "Errors: mean of |predicted - measured| / measured over the plans (the whole forward excluded).", ""]
    lines += ["| model | plans | roofline error | FLOPs error | time (noise) error | roofline shape | FLOPs shape |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        e, sh = r["mean_rel_error"], r["shape_error"]
        lines.append(f"| {r['model']} | {len(r['rows']) - 1} | {100 * e['roofline']:.1f} % | {100 * e['flops']:.1f} % | "
                     f"{100 * e['time']:.1f} % | {100 * sh['roofline']:.1f} % | {100 * sh['flops']:.1f} % |")
    for r in results:
        lines += ["", f"## {r['model']} {r['options']} ({r['nodes']} nodes)", "",
                  "| plan | regions | nodes | measured ms | roofline ms | FLOPs ms | time ms |", "|---|---|---|---|---|---|---|"]
        for row in r["rows"]:  # the first row is the whole forward, every node once
            lines.append(f"| {row['plan']} | {row['regions']} | {row['nodes']} | {row['measured_ms']:.2f} | "
                         f"{row['roofline_ms']:.2f} | {row['flops_ms']:.2f} | {row['time_ms']:.2f} |")
    write_page("cost_models.md", "Cost models: predicted vs measured recompute time", lines, quick=quick)
    with open(out_dir(quick) / "cost_models.json", "w", encoding="utf-8") as fh:
        json.dump({"cpu": cpu.to_dict(), "results": results}, fh, indent=1)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    main(quick="--quick" in sys.argv)
