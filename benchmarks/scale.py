"""Real LLMs at op granularity: optimal plans for Llama-2-7B, GPT-2-XL and Llama-2-70B.

Each model is built on the ``meta`` device (bf16, batch 1; Llama at seq
4096, GPT-2-XL at seq 1024), traced once at op granularity and regrouped at
the coarse default (``granularity="auto"``: at most 400 nodes). In a fresh
process that imports no torch, ``ilp`` solves each graph at 0.7, 0.8 and 0.9
of the op graph's store-all activation peak (the same bytes for both
graphs), with the frontier program composing the repeated blocks (NOTE
[ Composing repeated blocks ] in ``solvers.blocks.compose``), then once more walking
every node (``blocks=False``, no warm start: the program alone) for the
time the composition saves; that process's maximum
resident memory is the solve memory. Writes ``benchmarks/results/scale.md``
and ``scale.json``.

``python -m benchmarks.run --only scale`` (``--quick``: two small models).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.pages import out_dir, seconds, write_page

log = logging.getLogger("benchmarks.scale")
# Traced for their CUDA target (attention saves no S x S scores), these models' least feasible budgets sit
# above 0.5 of the activation peak: 0.2-0.5, the fractions of the math-path traces, were all infeasible.
FRACTIONS = (0.7, 0.8, 0.9)
TIME_LIMIT_S = 300.0
MODELS = [("hf:llama-2-7b", {"seq": 4096}), ("hf:gpt2-xl", {"seq": 1024}), ("hf:llama-2-70b", {"seq": 4096})]
QUICK = [("hf:llama-tiny", {"seq": 512, "layers": 4}), ("hf:gpt2", {"seq": 1024, "layers": 4})]


def _trace(name: str, opts: dict, folder: str) -> dict:
    """Trace ``name`` at op level; write the op and the coarse default graphs to ``folder``."""
    from graphs import save
    from scheduler.models import build
    from scheduler.tracing.tracer import capture

    t0 = time.perf_counter()
    ex = build(name, device="meta", dtype="bfloat16", **opts)
    traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op", name=name)
    trace_s = time.perf_counter() - t0
    coarse = traced.regroup("auto")
    paths = {}
    for label, g in (("op", traced.graph), ("coarse", coarse.graph)):
        paths[label] = os.path.join(folder, f"{name.replace(':', '-')}-{label}.json")
        save(g, paths[label])
    return {"trace_s": round(trace_s, 1), "paths": paths, "coarse_granularity": str(coarse.granularity)}


def _peak_rss_bytes() -> int:
    """This process's peak resident memory. ``VmHWM`` belongs to the process's own address space;
    ``getrusage``'s ``ru_maxrss`` keeps the peak of the parent it was forked from (the tracer with
    torch, 440 MiB) across ``exec``, so it is the fallback only."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _solve_child(op_path: str, coarse_path: str) -> dict:
    """In this process (no torch): ``ilp`` on both graphs at every fraction, and the max RSS."""
    import solvers
    from graphs import load
    from solvers import InfeasibleBudget, activation_budget_bytes
    from solvers.frontier.program import width
    from solvers.ilp import frontier_program

    op, coarse = load(op_path), load(coarse_path)
    step = op.total_fwd_flops() + op.total_bwd_flops()
    out: dict = {"graphs": {}}
    for label, g in (("op", op), ("coarse", coarse)):
        t0 = time.perf_counter()
        least = frontier_program(g).solve(None, objective="peak")
        out["graphs"][label] = {"nodes": len(g), "spans": len(g.spans), "width": width(g),
                                "store_all_bytes": solvers.store_all_peak(g).peak_bytes,
                                "least_bytes": least.objective, "least_s": round(time.perf_counter() - t0, 3)}
    rows = []
    walk = {"blocks": False, "warm_start": False}  # the program alone, node by node
    runs = [(label, g, opts) for label, g, opts in (("op", op, {}), ("coarse", coarse, {}), ("op, every node", op, walk))]
    for label, g, opts in runs:
        for f in FRACTIONS:
            budget = activation_budget_bytes(op, f)
            try:
                plan = solvers.solve(g, budget, solver="ilp", time_limit_s=TIME_LIMIT_S, **opts)
            except InfeasibleBudget as exc:
                rows.append({"fraction": f, "graph": label, "budget_bytes": budget, "status": "infeasible",
                             "least_bytes": exc.min_feasible_bytes})
                continue
            rows.append({"fraction": f, "graph": label, "budget_bytes": budget, "status": plan.status,
                         "recompute_flops": plan.recompute_flops, "overhead_pct": 100 * plan.recompute_flops / step,
                         "recompute_s": plan.recompute_time_s,
                         "peak_bytes": plan.peak_bytes, "solve_s": round(plan.solve_time_s, 3),
                         "method": plan.findings.get("method", plan.findings.get("incumbent", "")),
                         "blocks": plan.findings.get("blocks_composed", 0), "regions": len(plan.regions)})
        if label == "coarse":  # the composed solves are done: their memory, before the walk's
            out["max_rss_bytes"] = _peak_rss_bytes()
    out["rows"] = rows
    out["max_rss_walk_bytes"] = _peak_rss_bytes()
    return out


def _gib(b: int) -> str:
    return f"{b / 2**30:.2f} GiB"


def _cell(r: dict) -> str:
    if r["status"] == "infeasible":
        return f"infeasible (least {_gib(r['least_bytes'])})"
    blocks = f", {r['blocks']} blocks composed" if r.get("blocks") else ""
    time_s = f", {seconds(r['recompute_s'])}" if r.get("recompute_s") is not None else ""
    return f"{r['overhead_pct']:.2f}%{time_s} in {r['solve_s']:.2f} s ({r['status']}{blocks})"


def main(quick: bool = False) -> None:
    results = []
    with tempfile.TemporaryDirectory(prefix="ckpt-scale-") as folder:
        for name, opts in (QUICK if quick else MODELS):
            traced = _trace(name, opts, folder)
            log.info("%s traced in %.1fs", name, traced["trace_s"])
            proc = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--solve", traced["paths"]["op"],
                                   traced["paths"]["coarse"]], capture_output=True, text=True, check=False,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            if proc.returncode != 0:
                raise RuntimeError(f"solving {name} failed:\n{proc.stderr[-4000:]}")
            solved = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append({"model": name, "options": opts, **traced, **solved})
            log.info("%s: %s", name, solved["rows"])
    for r in results:
        r.pop("paths", None)
    with open(out_dir(quick) / "scale.json", "w") as fh:
        json.dump(results, fh, indent=1)
    _write(results, quick)


def _write(results: list[dict], quick: bool) -> None:
    lines = ["Models on the `meta` device, bf16, batch 1, traced once "
             "at op granularity (every module call a span: the plans are module-aligned, as `scheduler.apply` needs) "
             "and regrouped at the coarse default (`granularity=\"auto\"`). `ilp`, 300 s limit, 2 workers, in a "
             "fresh process without torch; budgets are fractions of the op graph's store-all activation peak, the "
             "same bytes for both graphs. Overhead: recompute FLOPs as % of the step's, and the predicted recompute time "
             "(the roofline cost at the graph's rate, an H100's: what `ilp` minimises). Solve times include the "
             "final `simulate` of the plan and, for the first budget, building the block fronts; \"walking every node\": "
             "the same program without composing blocks.", ""]
    lines += ["| model | graph | nodes | spans | open tensors | store-all | least feasible (ilp) | trace |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for label in ("op", "coarse"):
            g = r["graphs"][label]
            gran = "op" if label == "op" else f"auto ({r['coarse_granularity']})"
            lines.append(f"| {r['model']} ({', '.join(f'{k} {v}' for k, v in r['options'].items())}) | {gran} | "
                         f"{g['nodes']} | {g['spans']} | {g['width']} | {_gib(g['store_all_bytes'])} | "
                         f"{_gib(g['least_bytes'])} in {g['least_s']:.2f} s | "
                         f"{r['trace_s'] if label == 'op' else ''}{' s' if label == 'op' else ''} |")
    lines += ["", "| model | budget | op graph | coarse default | op saves | op, walking every node |",
              "|---|---|---|---|---|---|"]
    for r in results:
        by = {(x["fraction"], x["graph"]): x for x in r["rows"]}
        for f in FRACTIONS:
            op, co, walk = by[f, "op"], by[f, "coarse"], by[f, "op, every node"]
            if "recompute_flops" in op and "recompute_flops" in co and co["recompute_flops"]:
                saves = f"{100 * (1 - op['recompute_flops'] / co['recompute_flops']):.3g}% of the recompute"
            elif "recompute_flops" in op:
                saves = "coarse: no plan"
            else:
                saves = "—"
            walked = f"{walk['solve_s']:.2f} s ({walk['status']})" if "solve_s" in walk else walk["status"]
            lines.append(f"| {r['model']} | {f} ({_gib(op['budget_bytes'])}) | {_cell(op)} | {_cell(co)} | {saves} | "
                         f"{walked} |")
    lines += ["", "Solve memory (peak resident memory of the solving process, `VmHWM`, Python, numpy and OR-Tools included; "
              "about 94 MiB after importing `solvers`): "
              + "; ".join(f"{r['model']} {r['max_rss_bytes'] / 2**20:.0f} MiB for every composed solve, "
                          f"{r['max_rss_walk_bytes'] / 2**20:.0f} MiB once it also walked every node" for r in results)
              + "."]
    write_page("scale.md", "Real LLMs at op granularity", lines, quick=quick)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--solve":
        logging.basicConfig(level=logging.WARNING)
        print(json.dumps(_solve_child(sys.argv[2], sys.argv[3])))
    else:
        logging.basicConfig(level=logging.INFO)
        main(quick="--quick" in sys.argv)
