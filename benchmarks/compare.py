"""Our solvers against the tools people use today, on five models, in one run.

For the built-in GPT-2-shaped model, ResNet-50-shaped model, U-Net, VGG-19
and transformers GPT-2 (random weights, sizes for a 2-core CPU): every solver
and every peer measured side by side (``scheduler.comparing.run``), then the
Checkmate max-batch protocol on VGG-19 and solve time against graph size.

Writes under ``benchmarks/results/``:

* ``compare_<model>.json`` and ``compare_<model>_{pareto,timeline}.png``;
* ``compare_maxbatch.json``;
* ``compare_scaling.png`` (and ``compare_scaling.json`` when it measured);
* ``compare_summary.md``: every table and the claims (``benchmarks.pages``: the commit, command and machine).

``main(quick=True)`` runs one small model and a short max-batch search (under ``results/quick/``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace
from typing import Any

from scheduler.comparing.run import compare, format_table
from scheduler.comparing.workloads import BENCH_MODELS, QUICK_MODELS, workload

from benchmarks.pages import out_dir, seconds, write_page

log = logging.getLogger("benchmarks.compare")

FRACTIONS = (0.2, 0.3, 0.5, 0.7)
QUICK_FRACTIONS = (0.3, 0.5)
#: Fewer budgets where a step is slow (GPT-2's 50k-token head on a CPU).
MODEL_FRACTIONS = {"hf:gpt2": (0.3, 0.5)}
#: torch intra-op threads while measuring: other work shares the 2 cores, and
#: OMP barriers make 2-thread step times swing several-fold under contention.
THREADS = 1
#: Our solvers, when registered.
SOLVERS = ("chen-sqrt", "chen-greedy", "dp", "ilp")
#: Max-batch methods, in Checkmate's order (store-all first: the ratios' base).
MAXBATCH_METHODS = ("store-all", "chen-sqrt", "chen-greedy", "dp", "ilp")


def _registered(names: tuple[str, ...]) -> list[str]:
    import solvers

    return [n for n in names if n in solvers.available_solvers()]


def run_models(quick: bool) -> list[dict[str, Any]]:
    """Compare on each benchmark model; write its JSON and plots."""
    from scheduler.comparing.plots import plot_comparison

    out = []
    for spec in (QUICK_MODELS if quick else BENCH_MODELS):
        t0 = time.perf_counter()
        wl = workload(spec, quick=quick, bench=True)
        log.info("compare %s (%s)", wl.name, wl.meta)
        fractions = QUICK_FRACTIONS if quick else MODEL_FRACTIONS.get(spec, FRACTIONS)
        cmp = compare(wl, fractions, solver_names=_registered(SOLVERS),
                      repeats=3 if quick else 5, solver_options={"ilp": {"time_limit_s": 20}},
                      progress=lambda s: log.info("  %s", s))
        d = cmp.to_dict()
        d["wall_s"] = time.perf_counter() - t0
        slug = spec.replace(":", "-")
        with open(os.path.join(out_dir(quick), f"compare_{slug}.json"), "w", encoding="utf-8") as fh:
            json.dump(d, fh, indent=1)
        try:
            for path in plot_comparison(cmp, str(out_dir(quick))):
                os.replace(path, os.path.join(out_dir(quick), f"compare_{slug}_{path.rsplit('_', 1)[1]}"))
        except Exception as exc:  # plotting is optional (matplotlib missing): the numbers still stand
            log.warning("plots for %s skipped: %s", spec, exc)
        out.append({"spec": spec, "table": format_table(cmp), "cmp": d})
        log.info("%s done in %.0fs", spec, d["wall_s"])
    return out


def run_maxbatch(quick: bool) -> dict[str, Any]:
    """The Checkmate protocol on VGG-19: largest batch per method under one budget."""
    from benchmarks.maxbatch import CHECKMATE_VGG19, max_batches, vgg_maxbatch_setup

    graph_at, confirm, budget, hi, meta = vgg_maxbatch_setup(quick=quick)
    rows = max_batches(graph_at, budget, _registered(MAXBATCH_METHODS), hi=hi,
                       options={"ilp": {"time_limit_s": 20}}, confirm=confirm,
                       progress=lambda s: log.info("  maxbatch %s", s))
    # The same search on graphs with measured convolution workspaces (what the allocator sees).
    graph_ws, _, _, _, _ = vgg_maxbatch_setup(quick=quick, workspaces="measure")
    rows += [replace(r, method=f"{r.method} + workspaces")
             for r in max_batches(graph_ws, budget, _registered(("store-all", "dp", "ilp")), hi=hi,
                                  options={"ilp": {"time_limit_s": 20}}, confirm=confirm,
                                  progress=lambda s: log.info("  maxbatch (workspaces measured) %s", s))]
    d = {"budget_bytes": budget, "meta": meta, "checkmate_vgg19": CHECKMATE_VGG19,
         "rows": [r.__dict__ for r in rows]}
    with open(os.path.join(out_dir(quick), "compare_maxbatch.json"), "w", encoding="utf-8") as fh:
        json.dump(d, fh, indent=1)
    return d


def run_scaling(quick: bool) -> dict[str, Any]:
    """Solve time vs graph size: plot benchmarks/solvers.py's table when present, else measure."""
    from scheduler.comparing.plots import plot_scaling

    path = os.path.join(out_dir(quick), "solvers.csv")
    points = points_from_solvers_csv(path) if os.path.exists(path) else {}
    source = "benchmarks/results/solvers.csv (benchmarks/solvers.py), median over families and budgets"
    if not points:
        source = "measured here (benchmarks/solvers.py wrote no solvers.csv)"
        points = measure_scaling(quick)
        with open(os.path.join(out_dir(quick), "compare_scaling.json"), "w", encoding="utf-8") as fh:
            json.dump(points, fh, indent=1)
    plot_scaling(points, os.path.join(out_dir(quick), "compare_scaling.png"), title="solve time vs graph size")
    return {"source": source, "points": points}


def points_from_solvers_csv(path: str) -> dict[str, list[tuple[int, float]]]:
    """``(nodes, median solve seconds)`` per solver from benchmarks/solvers.py's ``solvers.csv``."""
    import csv
    import statistics

    times: dict[tuple[str, int], list[float]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            try:
                key = (rec["solver"], int(rec["nodes"]))
                times.setdefault(key, []).append(float(rec["solve_s"]))
            except (KeyError, ValueError, TypeError):
                continue  # a row without a solve time (solver not run at that size)
    points: dict[str, list[tuple[int, float]]] = {}
    for (solver, n), ts in sorted(times.items()):
        points.setdefault(solver, []).append((n, statistics.median(ts)))
    return points


def measure_scaling(quick: bool) -> dict[str, list[tuple[int, float]]]:
    """Solve time of each solver on synthetic transformer graphs of growing size, at 40 % of store-all."""
    import solvers
    from graphs import synthetic

    sizes = (16, 32, 64) if quick else (16, 32, 64, 128, 256, 512)
    out: dict[str, list[tuple[int, float]]] = {}
    for name in _registered(SOLVERS):
        for n in sizes:
            g = synthetic.make("transformer", n, seed=0) if hasattr(synthetic, "make") else synthetic.chain(n)
            budget = solvers.activation_budget_bytes(g, 0.4)
            t0 = time.perf_counter()
            try:
                solvers.solve(g, budget, solver=name, **({"time_limit_s": 10} if name == "ilp" else {}))
            except solvers.InfeasibleBudget:
                pass
            dt = time.perf_counter() - t0
            out.setdefault(name, []).append((len(g), dt))
            if dt > 20:  # the next size would take too long for the suite
                break
    return out


def write_summary(models: list[dict[str, Any]], maxbatch: dict[str, Any], scaling: dict[str, Any],
                  quick: bool) -> str:
    """``compare_summary.md``: the tables, claims, max batch and how they were made."""
    return str(write_page("compare_summary.md", TITLE, summary_markdown(models, maxbatch, scaling), quick=quick))


def _md(rows: list[tuple], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join("" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _mib(b: Any) -> str:
    return "" if b is None else f"{b / 2**20:.1f}"


def model_markdown(d: dict[str, Any]) -> str:
    """One model's comparison as a Markdown table plus its claims."""
    rows = []
    for r in d["rows"]:
        budget = f"{r['budget']:g}" if r["budget"] is not None else (f"={r['matched_to']}" if r.get("matched_to") else "")
        if r["reason"] is not None or r["measured_peak_bytes"] is None:
            rows.append((r["method"], budget, _mib(r["predicted_peak_bytes"]), "", "", "", "", "", "", "",
                         f"not run: {r['reason']}"))
            continue
        rows.append((r["method"], budget, _mib(r["predicted_peak_bytes"]), _mib(r["measured_peak_bytes"]),
                     _mib(r.get("meter_peak_bytes")), f"{r['step_time_ratio']:.2f}",
                     "" if r["recompute_ratio"] is None else f"{100 * r['recompute_ratio']:.0f}%",
                     seconds(r.get("predicted_extra_s")),
                     "" if r["measured_recompute_ratio"] is None else f"{100 * r['measured_recompute_ratio']:.0f}%",
                     f"{r['grad_max_abs_diff']:.1e}", r["note"]))
    meta = ", ".join(f"{k}={v}" for k, v in d["meta"].items()
                     if k not in ("machine", "torch", "store_all_predicted_bytes"))
    out = [f"### {d['model']}", "", f"{meta}; {d['graph_nodes']} graph nodes; "
           f"{d.get('wall_s', 0):.0f}s", "",
           _md(rows, ["method", "budget", "pred MiB", "meas MiB", "storages MiB", "time x", "recomp pred",
                      "recomp pred time", "recomp meas", "max grad diff", "note"]), ""]
    for c in d["claims"]:
        out.append(f"- {'holds' if c['holds'] else '**does not hold**'}: {c['claim']} ({c['detail']})")
    return "\n".join(out) + "\n"


def maxbatch_markdown(d: dict[str, Any]) -> str:
    """The max-batch table beside Checkmate's published VGG-19 numbers."""
    cm = d["checkmate_vgg19"]
    base = cm["store-all"]
    rows = []
    for r in d["rows"]:
        paper = cm.get(r["method"])
        rows.append((r["method"], "" if r["batch"] is None else f"{r['batch']}{'+' if r['capped'] else ''}",
                     "" if r["ratio"] is None else f"{r['ratio']:.2f}x",
                     "" if paper is None else f"{paper} ({paper / base:.2f}x)",
                     _mib(r["predicted_peak_bytes"]), _mib(r["measured_peak_bytes"]), _mib(r.get("meter_peak_bytes")),
                     "" if r["recompute_ratio"] is None else f"{100 * r['recompute_ratio']:.0f}%",
                     r["reason"] or ""))
    meta = ", ".join(f"{k}={v}" for k, v in d["meta"].items())
    return "\n".join([f"budget {_mib(d['budget_bytes'])} MiB for the whole step; {meta}", "",
                      _md(rows, ["method", "max batch", "vs store-all", "Checkmate (VGG-19, 224px, V100)",
                                 "pred MiB", "meas MiB", "storages MiB", "recompute", "note"])]) + "\n"


TITLE = "Compare: our solvers vs per-block, checkpoint_sequential, torch.compile"


def summary_markdown(models: list[dict[str, Any]], maxbatch: dict[str, Any], scaling: dict[str, Any]) -> str:
    """The whole suite as Markdown, below its title and header (``compare_summary.md``)."""
    parts = [f"Measured with {THREADS} torch thread.", "",
             "Peaks are whole-step bytes (parameters, inputs, gradients, activations). `meas` is the "
             "profiler's allocator events, the same for every method (compiled included), kernel workspaces "
             "included; `storages` is `scheduler.measuring.storages` (tensor storages, what `simulate` models; blind to "
             "compiled code); `pred` is `simulate`. time x is the median step time over the un-checkpointed "
             "step's, alternated in one run; `recomp pred` is the plan's recompute FLOPs over the step's, `recomp pred time` "
             "its predicted recompute time (what the solvers minimise: the roofline cost at the graph's rate), "
             "`recomp meas` the extra matmul/convolution FLOPs the profiler saw; grad diff is the largest absolute gradient difference from the "
             "un-checkpointed step with the same seed.", ""]
    parts += [model_markdown(m["cmp"]) for m in models]
    parts += ["## Max batch on VGG-19 (Checkmate protocol)", "", maxbatch_markdown(maxbatch),
              "## Solve time vs graph size", "", f"Source: {scaling['source']}. ![scaling](compare_scaling.png)", ""]
    return "\n".join(parts)


def main(quick: bool = False) -> None:
    import torch

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        models = run_models(quick)
        maxbatch = run_maxbatch(quick)
        scaling = run_scaling(quick)
    finally:
        torch.set_num_threads(threads)
    path = write_summary(models, maxbatch, scaling, quick)
    log.info("compare suite written to %s in %.0fs", path, time.perf_counter() - t0)


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(quick="--quick" in sys.argv)
