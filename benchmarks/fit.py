"""``ckpt fit`` results: the largest batch on a 2 GiB card, measured; Llama-2-7B sized on meta.

1. The built-in ``gpt`` (GPT-2 small shape, seq 256, fp32) on a 2 GiB budget
   on CPU (traced on meta for the CPU: ``target="cpu"``): with Adam nothing
   fits (the numbers say why); with plain SGD the
   search finds the largest batch per solver. One real step at the best
   solver's batch, with its plan applied, is measured (peak of live storages)
   and must stay under 2 GiB; store-all's largest batch is smaller.
2. Llama-2-7B (``hf:llama-2-7b``) built on the meta device, planned for the
   default target (CUDA, an H100, with its attention kernel): parameter,
   gradient and Adam-state figures against hand arithmetic, and whether
   sequence 4096 at batch 1 fits an 80 GiB card with and without a plan,
   under bf16 mixed precision (AdamW) and pure bf16 (AdamW).

Writes ``benchmarks/results/fit.md`` and ``fit.json`` (``--quick``: under ``results/quick/``).
"""

from __future__ import annotations

import json
import logging
import time

import solvers
from scheduler.sizing.memory import NothingFits, render_report

from benchmarks.pages import out_dir, seconds, write_page

log = logging.getLogger("benchmarks.fit")

GiB = 1 << 30
LLAMA2_7B = 32000 * 4096 * 2 + 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) + 4096


def _solvers() -> list[str]:
    """``ckpt fit``'s default solvers (``scheduler.sizing.search.DEFAULT_SOLVERS``) that are registered."""
    from scheduler.sizing.search import DEFAULT_SOLVERS

    have = solvers.available_solvers()
    return [s for s in DEFAULT_SOLVERS if s == "store-all" or s in have]


def _progress(probe) -> None:
    log.info("  %s at %d: %s", probe.solver, probe.size, "fits" if probe.fits else "does not fit")


def gpt_on_2gib(quick: bool) -> dict:
    """Search the largest batch of ``gpt`` at seq 256 on 2 GiB, then measure one real step at it."""
    import torch

    import scheduler
    from scheduler.models import build
    from scheduler.measuring.steps import measure_step_peak

    seq = 128 if quick else 256
    out: dict = {"model": "gpt", "seq": seq, "card_bytes": 2 * GiB}
    t0 = time.perf_counter()
    try:
        scheduler.fit("gpt", "2GiB", search="batch", seq=seq, optimizer="adam", solvers=["store-all"], target="cpu")
        out["adam"] = "fits"
    except NothingFits as exc:
        out["adam"] = str(exc).split(" What would help:")[0]
        out["adam_report"] = render_report(exc.report)
    res = scheduler.fit("gpt", "2GiB", search="batch", seq=seq, optimizer="sgd", solvers=_solvers(),
                        max_size=64, progress=_progress, target="cpu")  # the step measured below runs on the CPU
    out["search_s"] = time.perf_counter() - t0
    out["report"] = render_report(res.report)
    out["solvers"] = {r.solver: {"batch": r.size, "peak_bytes": r.peak_bytes, "recompute_ratio": r.recompute_ratio,
                                 "recompute_s": getattr(r.plan, "recompute_time_s", None), "probes": len(r.probes)} for r in res.results}
    out["traces"] = res.traces
    best = res.best()  # the plan ckpt fit reports (NOTE [ The plan fit reports ])
    out["best_solver"], out["best_batch"] = best.solver, best.size
    # One real step at that batch on CPU: trace the real model, solve with the same budget, apply, measure.
    torch.manual_seed(0)
    ex = build("gpt", batch=best.size, seq=seq)
    graph = scheduler.trace(ex.model, ex.args, ex.kwargs, loss=ex.loss)
    budget = res.report.solver_budget_bytes
    plan = solvers.solve(graph, budget, solver=best.solver) if best.solver != "store-all" else solvers.Plan(())
    scheduler.apply(ex.model, plan)  # onto the module, as a user applies it (kept op outputs included)
    loss = ex.loss or (lambda o: o)
    measured = measure_step_peak(ex.model, ex.model, ex.args, dict(ex.kwargs), loss)
    state = res.report.state.outside_simulation_bytes  # SGD: 0
    out["measured_peak_bytes"] = measured + state
    out["predicted_peak_bytes"] = solvers.simulate(graph, plan, record=False).peak_bytes + state
    out["measured_fits"] = out["measured_peak_bytes"] <= 2 * GiB
    out["store_all_batch"] = res.result("store-all").size
    log.info("gpt: best %s batch %d, measured %.3f GiB (store-all batch %s)", best.solver, best.size,
             out["measured_peak_bytes"] / GiB, out["store_all_batch"])
    return out


def llama_on_80gib() -> dict:
    """Llama-2-7B on meta: state figures vs hand counts; seq 4096, batch 1 on 80 GiB with and without a plan."""
    import scheduler

    out: dict = {"hand_params": LLAMA2_7B, "cases": []}
    cases = [("bf16 mixed precision, AdamW", dict(dtype="bf16", mixed_precision=True, optimizer="adamw")),
             ("pure bf16, AdamW", dict(dtype="bf16", mixed_precision=False, optimizer="adamw"))]
    for label, opts in cases:
        t0 = time.perf_counter()
        case: dict = {"label": label, **opts}
        try:
            res = scheduler.fit("hf:llama-2-7b", "80GiB", search="batch", batch=1, seq=4096, min_size=1, max_size=1,
                                solvers=_solvers(), progress=_progress, **opts)
            rep = res.report
            case["verdicts"] = {r.solver: r.size is not None for r in res.results}
            case["recompute"] = {r.solver: r.recompute_ratio for r in res.results if r.size}
            case["recompute_s"] = {r.solver: getattr(r.plan, "recompute_time_s", None) for r in res.results if r.size}
            case["totals"] = {p.solver: rep.total_bytes(p) for p in rep.plans}
        except NothingFits as exc:
            rep = exc.report
            case["verdicts"] = {s: False for s in _solvers()}
            case["nothing_fits"] = str(exc).split(" What would help:")[0]
            case["levers"] = list(exc.levers)
        s = rep.state
        case.update(params=s.params, param_bytes=s.param_bytes, grad_bytes=s.grad_bytes,
                    optimizer_bytes=s.optimizer_bytes, master_bytes=s.master_bytes, report=render_report(rep),
                    elapsed_s=time.perf_counter() - t0)
        case["hand_ok"] = (s.params == LLAMA2_7B and s.param_bytes == 2 * LLAMA2_7B and s.grad_bytes == 2 * LLAMA2_7B
                           and s.optimizer_bytes == (8 if opts["mixed_precision"] else 4) * LLAMA2_7B)
        out["cases"].append(case)
    return out


def _recompute(case: dict, solver: str) -> str:
    """`` (+12.3 % FLOPs, 1.234 s predicted)`` for a solver that fits in a Llama case, else empty."""
    ratio, secs = case.get("recompute", {}).get(solver), case.get("recompute_s", {}).get(solver)
    if ratio is None:
        return ""
    return f" (+{100 * ratio:.1f} % FLOPs" + (f", {seconds(secs)} predicted)" if secs is not None else ")")


def _markdown(gpt: dict, llama: dict) -> str:
    g = gpt
    lines = [f"## gpt (GPT-2 small shape), seq {g['seq']}, fp32, 2 GiB card, CPU", "",
             f"With Adam: {g['adam']}", "", "With plain SGD (no optimizer state):", "",
             "```", g["report"], "```", "",
             "Recompute: FLOPs over the step's; predicted time: the plan's recompute time at the graph's rate "
             "(the roofline cost, what the solvers minimise; `fit` reports the plan with the least of it).", "",
             "| solver | largest batch | simulated step peak | recompute | predicted recompute time | sizes tried |",
             "|---|---|---|---|---|---|"]
    for name, r in g["solvers"].items():
        peak = f"{r['peak_bytes'] / GiB:.3f} GiB" if r["peak_bytes"] else "-"
        rec = f"+{100 * r['recompute_ratio']:.1f}%" if r["recompute_ratio"] is not None else "-"
        lines.append(f"| {name} | {r['batch']} | {peak} | {rec} | {seconds(r.get('recompute_s'))} | {r['probes']} |")
    lines += ["", f"Search: {g['traces']} traces, {g['search_s']:.0f} s. Measured step at batch {g['best_batch']} "
              f"with the {g['best_solver']} plan applied: **{g['measured_peak_bytes'] / GiB:.3f} GiB** "
              f"(predicted {g['predicted_peak_bytes'] / GiB:.3f} GiB; "
              f"{'under' if g['measured_fits'] else 'OVER'} 2 GiB). Store-all fits batch {g['store_all_batch']}.", "",
              "## Llama-2-7B (hf:llama-2-7b) on the meta device, batch 1, seq 4096, 80 GiB card", "",
              f"Hand count: 32000 x 4096 x 2 + 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + 4096 = "
              f"{llama['hand_params']:,} parameters.", ""]
    for c in llama["cases"]:
        verdict = ", ".join(f"{k}: {'fits' if v else 'does not fit'}{_recompute(c, k)}"
                            for k, v in c["verdicts"].items())
        lines += [f"### {c['label']} ({c['elapsed_s']:.0f} s)", "",
                  f"parameters {c['params']:,}, weights {c['param_bytes']:,} B, gradients {c['grad_bytes']:,} B, "
                  f"optimizer state {c['optimizer_bytes']:,} B, master {c['master_bytes']:,} B: "
                  f"{'match' if c['hand_ok'] else 'DO NOT match'} hand arithmetic.", "",
                  f"Verdict: {verdict}.", ""]
        if c.get("nothing_fits"):
            lines += [c["nothing_fits"], ""]
        lines += ["```", c["report"], "```", ""]
    return "\n".join(lines)


def main(quick: bool = False) -> None:
    logging.getLogger("scheduler").setLevel(logging.WARNING)
    gpt = gpt_on_2gib(quick)
    llama = llama_on_80gib()
    with open(out_dir(quick) / "fit.json", "w") as f:
        json.dump({"gpt": gpt, "llama": llama}, f, indent=1, default=str)
    log.info("wrote %s", write_page("fit.md", "`ckpt fit` results", _markdown(gpt, llama), quick=quick))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main()
