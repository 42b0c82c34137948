"""The price of alignment: span-only plans vs any-interval plans on a transformer.

``synthetic.transformer(n, spans=True)`` lists a GPT-2-like module tree's
calls (each block, its ``ln_1`` / ``attn`` / ``ln_2`` / ``mlp``, the
embedding, ``ln_f``, ``lm_head``): what a plan applied by hooks on submodules
may checkpoint (NOTE [ Module-aligned regions ]). For ``dp`` and ``ilp`` at
budgets 0.2 and 0.5 of store-all, the solve time and the recompute overhead
with that restriction and without it (``graph.unaligned()``). Writes
``benchmarks/results/aligned.md``.
"""

from __future__ import annotations

import logging

import solvers
from graphs import synthetic
from solvers import InfeasibleBudget, activation_budget_bytes

from benchmarks.pages import write_page

log = logging.getLogger("benchmarks.aligned")
FRACTIONS = (0.2, 0.5)


def _run(graph, budget, name, **opts) -> dict:
    solvers.dp.chain._CACHE.clear()  # time the table fill too, as a first solve would
    try:
        plan = solvers.solve(graph, budget, solver=name, **opts)
    except InfeasibleBudget as exc:
        return {"status": "infeasible", "least_mib": round(exc.min_feasible_bytes / 2**20, 1)}
    step = graph.total_fwd_flops() + graph.total_bwd_flops()
    return {"status": plan.status, "flops": plan.recompute_flops, "overhead_pct": round(100 * plan.recompute_flops / step, 2),
            "solve_s": round(plan.solve_time_s, 3), "via": plan.findings.get("method", plan.findings.get("incumbent", "")),
            "regions": len(plan.regions)}


def _cell(r: dict) -> str:
    if r["status"] == "infeasible":
        return f"infeasible (least {r['least_mib']} MiB)"
    via = f", {r['via']}" if r.get("via") else ""
    return f"{r['overhead_pct']}% in {r['solve_s']} s ({r['status']}{via}, {r['regions']} regions)"


def main(quick: bool = False) -> None:
    lines = ["Transformer graphs with spans per block and per "
             "sub-layer (`synthetic.transformer(n, spans=True)`); overhead is recompute FLOPs as % of the step "
             "(what the solvers minimise: synthetic graphs carry no time costs); "
             "times include dp's table fill; ilp: 120 s limit, 2 workers. Price: aligned recompute / unaligned - 1.", "",
             "| nodes | spans | budget | solver | aligned | unaligned | price |", "|---|---|---|---|---|---|---|"]
    solvers.solve(synthetic.chain(4), 10**12, solver="dp")  # load the compiled kernel before timing
    for n in ((101,) if quick else (101, 293, 701)):
        g = synthetic.transformer(n, spans=True)
        for f in FRACTIONS:
            budget = activation_budget_bytes(g, f)
            for name in ("dp", "ilp"):
                opts = {"time_limit_s": 120, "workers": 2} if name == "ilp" else {}
                al, un = _run(g, budget, name, **opts), _run(g.unaligned(), budget, name, **opts)
                price = (f"{100 * (al['flops'] / un['flops'] - 1):+.2f}%" if "flops" in al and "flops" in un
                         and un["flops"] else "—")
                log.info("%d nodes, %.1f, %s: aligned %s, unaligned %s", len(g), f, name, al, un)
                lines.append(f"| {len(g)} | {len(g.spans)} | {f} | {name} | {_cell(al)} | {_cell(un)} | {price} |")
    write_page("aligned.md", "The price of alignment", lines, quick=quick)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
