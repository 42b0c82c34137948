"""Solver benchmark: recompute overhead and solve time per family, size, budget.

Writes ``benchmarks/results/solvers.md`` and ``solvers.csv``. Budgets are
fractions of the store-all activation peak (``activation_budget_bytes``);
overhead is recompute FLOPs / FLOPs of the un-checkpointed step. Also
measured: the DP table fill time on a 1000-node chain, and the ilp gap on a
700-node DAG after its time limit.
"""

from __future__ import annotations

import csv
import logging
import os
import platform
import time

import solvers
from graphs import synthetic
from solvers import InfeasibleBudget, activation_budget_bytes
from solvers.dp import DPTable
from solvers.ilp import IlpTimeout

log = logging.getLogger("benchmarks.solvers")
OUT = os.path.join(os.path.dirname(__file__), "results")
FAMILIES = ["chain", "residual", "unet", "transformer", "random-dag"]
FRACTIONS = [0.2, 0.4, 0.6, 0.8]
SOLVERS = ["uniform", "per-module", "chen-sqrt", "chen-greedy", "chen", "dp", "ilp"]


def _run(graph, budget, name, **opts):
    t0 = time.perf_counter()
    try:
        plan = solvers.solve(graph, budget, solver=name, **opts)
    except InfeasibleBudget as exc:
        return {"status": "infeasible", "overhead_pct": "", "gap_pct": "", "solve_s": round(time.perf_counter() - t0, 3),
                "min_feasible": exc.min_feasible_bytes}
    except (IlpTimeout, solvers.CkptError) as exc:
        return {"status": type(exc).__name__, "overhead_pct": "", "gap_pct": "", "solve_s": round(time.perf_counter() - t0, 3)}
    step = graph.total_fwd_flops() + graph.total_bwd_flops()
    return {"status": plan.status, "overhead_pct": round(100 * plan.recompute_flops / step, 2),
            "gap_pct": "" if plan.gap is None else round(100 * plan.gap, 2), "solve_s": round(plan.solve_time_s, 3)}


def main(quick: bool = False) -> None:
    os.makedirs(OUT, exist_ok=True)
    sizes = [10, 30] if quick else [10, 30, 100, 300]
    rows = []
    for fam in FAMILIES:
        for n in sizes:
            if fam == "unet" and n > 100:
                continue  # the generator's decoder sizes grow as 2**depth past ~100 nodes
            graph = synthetic.make(fam, n, seed=0)
            for f in FRACTIONS:
                budget = activation_budget_bytes(graph, f)
                for name in SOLVERS:
                    if name == "per-module" and fam != "transformer":
                        continue
                    opts = {}
                    if name == "ilp":
                        if n > 100:
                            continue
                        opts = {"time_limit_s": 5 if n <= 30 else 15}
                    r = _run(graph, budget, name, **opts)
                    rows.append({"family": fam, "nodes": len(graph), "fraction": f, "solver": name, **r})
                    log.info("%s", rows[-1])
    extras = []
    if not quick:
        g = synthetic.make("chain", 1000)
        t0 = time.perf_counter()
        table = DPTable(g)
        extras.append(f"- DP table fill, 1000-node chain (max_front {table.max_front}): "
                      f"{time.perf_counter() - t0:.1f} s (thinned: {table.thinned}); target was < 1 s")
        g = synthetic.make("random-dag", 700)
        r = _run(g, activation_budget_bytes(g, 0.5), "ilp", time_limit_s=120)
        extras.append(f"- ilp on a 700-node random DAG, budget 0.5, 120 s limit: status {r['status']}, "
                      f"overhead {r['overhead_pct']}%, gap {r['gap_pct']}%, {r['solve_s']} s")
    keys = ["family", "nodes", "fraction", "solver", "status", "overhead_pct", "gap_pct", "solve_s"]
    with open(os.path.join(OUT, "solvers.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    lines = ["# Solver benchmark", "",
             f"`python -m benchmarks.run --only solvers{' --quick' if quick else ''}` on {os.cpu_count()} CPU cores "
             f"({platform.processor() or platform.machine()}). Overhead: recompute FLOPs as % of the step's FLOPs "
             "(blank: infeasible at that budget). ilp: 5 s limit up to 30 nodes, 15 s at 100, not run above.", ""]
    lines += extras + [""]
    lines.append("| family | nodes | budget | " + " | ".join(SOLVERS) + " | ilp gap | ilp s | dp s |")
    lines.append("|" + "---|" * (len(SOLVERS) + 6))
    by = {}
    for r in rows:
        by.setdefault((r["family"], r["nodes"], r["fraction"]), {})[r["solver"]] = r
    for (fam, n, f), d in by.items():
        cells = []
        for s in SOLVERS:
            r = d.get(s)
            cells.append("—" if r is None else ("inf" if r["overhead_pct"] == "" else f"{r['overhead_pct']}%"))
        ilp = d.get("ilp", {})
        lines.append(f"| {fam} | {n} | {f} | " + " | ".join(cells)
                     + f" | {ilp.get('gap_pct', '')} | {ilp.get('solve_s', '')} | {d['dp']['solve_s']} |")
    with open(os.path.join(OUT, "solvers.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
