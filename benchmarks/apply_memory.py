"""Applied plans on real CPU steps: measured peak vs budget vs simulate, time ratio vs predicted.

For each built-in example (and transformers GPT-2, 2 layers) at budgets 0.3,
0.5 and 0.7 of the store-all activation peak, the plan with the least
predicted recompute time (the solvers' objective) over every registered solver is applied and verified
(``scheduler.measuring.verification``: peaks measured with ``scheduler.measuring.storages``, step-time
ratio as the median of 5 steps of each, alternated in one run). Then the
trade-off on the GPT-2-shaped model (12 layers, width 768, vocabulary 50257,
sequence 1024, batch 1): time overhead against the budget.

Writes ``benchmarks/results/apply_memory.md`` and ``.json`` (``--quick``: under ``results/quick/``).
"""

from __future__ import annotations

import json
import logging

import torch

import solvers
from solvers import InfeasibleBudget, activation_budget_bytes

from benchmarks.pages import out_dir, seconds, write_page

log = logging.getLogger(__name__)

MODELS = {  # name: (quick options, full options)
    "gpt": (dict(layers=2, width=128, heads=4, vocab=1024, seq=128, batch=2),
            dict(layers=4, width=256, heads=4, vocab=8192, seq=256, batch=2)),
    "resnet": (dict(width=8, image_size=32), dict(width=16, image_size=64)),
    "unet": (dict(levels=2, width=8, image_size=32), dict(levels=3, width=16, image_size=64)),
    "vgg19": (dict(width=8, image_size=32, hidden=64), dict(width=16, image_size=64, hidden=256)),
    "hf:gpt2": (dict(layers=2, seq=64, batch=1), dict(layers=2, seq=256, batch=2)),
}
FRACTIONS = (0.3, 0.5, 0.7)
TRADEOFF = (dict(layers=2, seq=256, batch=1), dict(layers=12, width=768, heads=12, vocab=50257, seq=1024, batch=1))
TRADEOFF_FRACTIONS = (0.2, 0.5)


def _best_plan(graph, budget):
    from scheduler.comparing.choosing import pick_key

    best, errors = None, []
    for name in solvers.available_solvers():
        try:
            plan = solvers.solve(graph, budget, solver=name, **({"time_limit_s": 15} if name == "ilp" else {}))
        except InfeasibleBudget as exc:
            errors.append(exc.min_feasible_bytes)
            continue
        except Exception:  # noqa: BLE001  (a failing solver is logged, the others still run)
            log.exception("solver %s failed", name)
            continue
        if best is None or pick_key(plan) < pick_key(best):
            best = plan
    return best, (min(errors) if errors else None)


def _measure(name, opts, fractions, steps, warmup=1):
    from scheduler.applying.graph import CheckpointedModule, cut
    from scheduler.sizing.floor import explain_floor
    from scheduler.models import build
    from scheduler.tracing.tracer import capture
    from scheduler.measuring.verification import verify

    torch.manual_seed(0)
    ex = build(name, **opts)
    ex.model.train()
    traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss)
    graph = traced.graph
    rows = []
    for f in fractions:
        budget = activation_budget_bytes(graph, f)
        plan, least = _best_plan(graph, budget)
        row = {"model": name, "nodes": len(graph), "fraction": f, "budget_bytes": budget}
        if plan is None:
            row["infeasible"] = least
            row["floor"] = explain_floor(graph, None).text
            rows.append(row)
            log.info("%s at %.1f: infeasible (least %s)", name, f, least)
            continue
        split, regions = cut(traced, plan)
        applied = CheckpointedModule(ex.model, split, traced, plan, regions)
        v = verify(ex.model, plan, ex.args, dict(ex.kwargs), loss=ex.loss, applied=applied, steps=steps,
                   warmup=warmup)
        row.update(solver=plan.solver, regions=len(plan.regions), predicted=v.predicted_peak_bytes,
                   measured=v.measured_peak_bytes, store_all=v.measured_store_all_bytes, fits=v.fits,
                   error=v.peak_error, time_ratio=v.step_time_ratio, predicted_time_ratio=v.predicted_time_ratio,
                   recompute_s=v.predicted_recompute_s, step_s=v.step_time_s,
                   grad_diff=v.max_grad_diff, buffers_equal=v.buffers_equal)
        rows.append(row)
        log.info("%s", row)
    return rows


def _md(rows, tradeoff, meta):
    mib = 2 ** 20
    out = [f"{meta}", "",
           "Predicted time: `predicted (FLOPs)` is 1 + the plan's recompute FLOPs over the step's; `recompute time "
           "predicted` is the plan's predicted recompute time (the roofline cost at the graph's rate: what the "
           "solvers minimise), beside the measured plain step.", ""]
    if not rows:
        out += ["Per-model rows: the full run leaves them to `benchmarks/compare.py` (the same models, every solver "
                "and peer applied and measured: `compare_summary.md`); `--quick` runs them here.", ""]
    out += ["| model | nodes | budget | solver | regions | measured peak | predicted | error | fits | store-all measured "
           "| time ratio | predicted (FLOPs) | recompute time predicted | plain step | max grad diff |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"] if rows else []
    for r in rows:
        if "infeasible" in r:
            out.append(f"| {r['model']} | {r['nodes']} | {r['fraction']} ({r['budget_bytes'] / mib:.1f} MiB) | "
                       f"infeasible (least {r['infeasible'] / mib if r['infeasible'] else float('nan'):.1f} MiB) "
                       "| | | | | | | | | | | |")
            continue
        out.append(f"| {r['model']} | {r['nodes']} | {r['fraction']} ({r['budget_bytes'] / mib:.1f} MiB) | {r['solver']} "
                   f"| {r['regions']} | {r['measured'] / mib:.1f} MiB | {r['predicted'] / mib:.1f} MiB | "
                   f"{100 * r['error']:+.1f}% | {'yes' if r['fits'] else 'NO'} | {r['store_all'] / mib:.1f} MiB | "
                   f"{r['time_ratio']:.2f} | {r['predicted_time_ratio']:.2f} | {seconds(r.get('recompute_s'))} | "
                   f"{seconds(r['step_s'])} | {r['grad_diff']:.3g} |")
    out += ["", "## Trade-off on the GPT-2-shaped model", "",
            "| budget | solver | measured peak | predicted | time overhead measured | predicted (FLOPs) "
            "| recompute time predicted | plain step |",
            "|---|---|---|---|---|---|---|---|"]
    for r in tradeoff:
        if "infeasible" in r:
            out.append(f"| {r['fraction']} | infeasible | | | | | | |")
            continue
        out.append(f"| {r['fraction']} | {r['solver']} | {r['measured'] / mib:.1f} MiB | {r['predicted'] / mib:.1f} MiB "
                   f"| {100 * (r['time_ratio'] - 1):+.1f}% | {100 * (r['predicted_time_ratio'] - 1):+.1f}% | {seconds(r.get('recompute_s'))} "
                   f"| {seconds(r['step_s'])} |")
    floors = {r["floor"] for r in rows + tradeoff if "floor" in r}
    if floors:
        out += ["", "What sets the floor where no plan fits:", ""] + [f"- {t}" for t in sorted(floors)]
    return "\n".join(out) + "\n"


def main(quick: bool = False) -> None:
    k = 0 if quick else 1
    steps = 3 if quick else 5
    rows = []
    # The full run's per-model rows are benchmarks/compare.py's (same models, every solver and peer, measured):
    # here only the quick smoke rows, so that one make bench stays within 30 minutes on 2 cores.
    for name, opts in (MODELS.items() if quick else ()):
        rows += _measure(name, opts[k], FRACTIONS, steps)
    # The 12-layer, sequence-1024 model takes ~15 s a step on 2 cores: median of 3 keeps make bench near 30 min.
    # The equality and memory steps before the timed ones warm up: no extra warm-up step.
    tradeoff = _measure("gpt", TRADEOFF[k], TRADEOFF_FRACTIONS, 3, warmup=0)
    meta = (f"{torch.get_num_threads()} threads, solvers {', '.join(solvers.available_solvers())}, median of {steps} "
            f"steps each (trade-off: 3). Trade-off model: {TRADEOFF[k]}")
    write_page("apply_memory.md", "Applied plans: measured on real CPU steps", _md(rows, tradeoff, meta), quick=quick)
    (out_dir(quick) / "apply_memory.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "tradeoff": tradeoff}, indent=1))
    log.info("apply_memory: %s", meta)


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    main(quick="--quick" in sys.argv)
