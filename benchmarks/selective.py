"""Issue 15: our best plan against per-block checkpointing at per-block's own measured peak.

For the built-in GPT (width 768, so matmuls dominate a step), the ResNet-50
shape, the U-Net and transformers' GPT-2 (GPT-2 small's width, fewer layers
and a smaller vocabulary so a CPU step takes about a second), in one process
per model (``scheduler.comparing.headtohead``):

* per-block checkpointing's measured peak and step time;
* our plan solved at that peak (re-solved below it while ours measures
  above), its measured peak, and the median step-time ratio ours/per-block
  over alternated rounds (plain, per-block and ours once each per round);
* gradients against the plain step (bitwise: a max difference of 0);
* every side's measured extra time over the plain step, and the extra time
  predicted with the roofline costs (the solvers' default) and with FLOPs;
* the same against ``torch.compile`` (``aot_eager``) at
  ``activation_memory_budget`` 0.3 and 0.5, ours at its measured peak.

Writes ``benchmarks/results/selective.json`` and ``selective.md``.
``main(quick=True)`` runs tiny models with fewer rounds (tests).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from typing import Any

import torch

from benchmarks.pages import out_dir, write_page

log = logging.getLogger("benchmarks.selective")

#: torch intra-op threads while measuring (the machine is shared: one thread is steadier).
THREADS = 1
#: Alternated rounds per head-to-head (median of each method's 7 steps).
REPEATS = 7
#: torch.compile's activation_memory_budget fractions compared.
COMPILE_FRACTIONS = (0.3, 0.5)
#: Our solvers (the plan with the lowest recompute_cost is ours).
SOLVERS = ("dp",)
#: Cost models traced: the first is what our solvers minimise; each predicts the extra time.
COST_MODELS = ("roofline", "flops")

#: name -> options (``scheduler.comparing.workloads.workload``), benchmark size. The transformers run
#: 1,024 tokens a step: with fewer (batch 2 x 128) the step's peak is parameters and gradients at the end of
#: the backward, per-block lowers no peak at all, and "ours at its peak" is store-all.
MODELS: dict[str, dict[str, Any]] = {
    "gpt": dict(layers=4, width=768, heads=12, vocab=2048, batch=4, seq=256),
    "resnet": dict(depth=50, width=16, classes=100, batch=8, image_size=64),
    "unet": dict(levels=3, width=16, batch=4, image_size=64),
    "hf:gpt2": dict(n_layer=4, n_embd=768, n_head=12, vocab_size=8192, batch=4, seq=256),
}
QUICK_MODELS: dict[str, dict[str, Any]] = {
    "gpt": dict(layers=2, width=64, heads=2, vocab=256, batch=2, seq=32),
}


def run(quick: bool = False, models: dict[str, dict[str, Any]] | None = None, *, with_compile: bool = True,
        repeats: int | None = None) -> dict[str, Any]:
    """Every model's head-to-heads; returns the JSON document."""
    from scheduler.comparing.headtohead import head_to_head
    from scheduler.comparing.run import _Bench, trace_graph
    from scheduler.comparing.workloads import workload

    models = models if models is not None else (QUICK_MODELS if quick else MODELS)
    repeats = repeats or (3 if quick else REPEATS)
    lowers = True  # scheduler.apply lowers kept nodes to a selective-checkpoint policy per region
    out: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
                           "torch": torch.__version__, "threads": THREADS, "repeats": repeats, "solvers": list(SOLVERS),
                           "selective": lowers, "cost_models": list(COST_MODELS), "models": []}
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        for name, opts in models.items():
            t0 = time.perf_counter()
            wl = workload(name, options=opts)
            log.info("selective: %s %s", name, opts)
            graphs = {c: trace_graph(wl, c) for c in COST_MODELS}
            bench = _Bench(wl, repeats=repeats, warmup=1)
            entry: dict[str, Any] = {"model": name, "options": opts, "graph_nodes": len(graphs[COST_MODELS[0]]),
                                     "rates": {c: (g.meta.get("costs") or {}).get("flops_per_s") for c, g in graphs.items()},
                                     "pairs": []}
            peers = [("per-block", None)] + ([("torch.compile", f) for f in COMPILE_FRACTIONS] if with_compile else [])
            for peer, fraction in peers:
                try:
                    h = head_to_head(wl, peer, fraction=fraction, solver_names=SOLVERS, selective=lowers, repeats=repeats,
                                     cost_models=COST_MODELS, graphs=graphs, bench=bench,
                                     progress=lambda s: log.info("  %s", s))
                    d = h.to_dict()
                    d["errors"] = {c: h.error(c) for c in COST_MODELS}
                except Exception as exc:  # one failing pair is a finding, not the end of the run
                    log.warning("%s vs %s failed", name, peer, exc_info=True)
                    d = {"model": name, "peer": None, "ours": None, "reason": f"{type(exc).__name__}: {exc}"[:200],
                         "errors": {}}
                d["peer_name"] = peer if fraction is None else f"{peer}@{fraction:g}"
                entry["pairs"].append(d)
            entry["wall_s"] = time.perf_counter() - t0
            out["models"].append(entry)
            log.info("selective: %s done in %.0fs", name, entry["wall_s"])
    finally:
        torch.set_num_threads(threads)
    return out


def _mib(b: Any) -> str:
    return f"{b / 2**20:.1f}" if isinstance(b, (int, float)) else ""


def _ms(s: Any) -> str:
    return f"{s * 1e3:.1f}" if isinstance(s, (int, float)) else ""


TITLE = "Ours vs per-block checkpointing at per-block's measured peak"


def report(doc: dict[str, Any]) -> str:
    """The Markdown tables of a :func:`run` document (the page below its title and header)."""
    sel = "on (kept nodes run as one selective-checkpoint policy per region)" if doc["selective"] else "off"
    lines = [
        f"{doc['threads']} torch thread; our solvers: {', '.join(doc['solvers'])}, picked by `recompute_cost` (roofline); selective recompute {sel}.",
        "",
        f"Each pair is measured in one process: the plain step, the peer and our plan run in {doc['repeats']} "
        "alternated rounds (the order rotates every round) and each time is the median of its "
        f"{doc['repeats']} steps. Our plan is solved with the peer's measured peak (profiler allocator events, "
        "whole step) as its budget, and again below it while it measures above. `extra` is a method's median "
        "step time less the plain step's; `pred` is the recompute cost of its regions at the graph's rate, "
        "with roofline costs (the default) and with FLOPs. Gradients are compared with the plain step's; "
        "0 means bitwise equal.",
        "",
        "| model | peer | peer MiB | ours MiB | solves | peer ms | ours ms | ours/peer | grad diff peer / ours | "
        "peer extra ms (meas / roofline / flops) | ours extra ms (meas / roofline / flops) | "
        "error ms roofline / flops |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in doc["models"]:
        for p in m["pairs"]:
            peer, ours = p.get("peer"), p.get("ours")
            if not peer or not ours:
                lines.append(f"| {m['model']} | {p['peer_name']} | | | | | | | | | | not run: {p.get('reason')} |")
                continue

            def extra(side: dict[str, Any]) -> str:
                pr = side["predicted_extra_s"]
                return " / ".join([_ms(side["extra_s"]), _ms(pr.get("roofline")) or "-", _ms(pr.get("flops")) or "-"])

            err = p.get("errors") or {}
            lines.append(
                f"| {m['model']} | {p['peer_name']} | {_mib(peer['peak_bytes'])} | {_mib(ours['peak_bytes'])} | "
                f"{ours['solves']} | {_ms(peer['time_s'])} | {_ms(ours['time_s'])} | {p['ratio']:.3f} | "
                f"{peer['grad_max_abs_diff']:.1e} / {ours['grad_max_abs_diff']:.1e} | {extra(peer)} | {extra(ours)} | "
                f"{_ms(err.get('roofline')) or '-'} / {_ms(err.get('flops')) or '-'} |")
    lines += ["", "## What it must show", ""]
    lines += claims(doc)
    lines += ["", "Model sizes: " + "; ".join(f"{m['model']} {m['options']} ({m['graph_nodes']} nodes, "
                                              f"{m['wall_s']:.0f}s)" for m in doc["models"]), ""]
    return "\n".join(lines)


def claims(doc: dict[str, Any]) -> list[str]:
    """Issue 15's checks on the per-block pairs, one line each."""
    out = []
    pb = [(m["model"], p) for m in doc["models"] for p in m["pairs"] if p["peer_name"] == "per-block"]
    ran = [(n, p) for n, p in pb if p.get("ours") and p.get("peer")]
    slower = [n for n, p in ran if p["ratio"] > 1.0]
    faster = [n for n, p in ran if p["ratio"] < 1.0]
    ratios = ", ".join(f"{n} {p['ratio']:.3f}" for n, p in ran)
    out.append(f"- {'holds' if ran and not slower and len(ran) == len(pb) else '**does not hold**'}: no slower than "
               f"per-block on every model (ours/per-block time: {ratios})"
               + (f"; not run: {', '.join(n for n, p in pb if (n, p) not in ran)}" if len(ran) < len(pb) else ""))
    out.append(f"- {'holds' if len(faster) >= 2 else '**does not hold**'}: faster on at least two "
               f"({', '.join(faster) or 'none'})")
    mem = [n for n, p in ran if p["ours"]["peak_bytes"] <= p["peer"]["peak_bytes"]]
    out.append(f"- {'holds' if len(mem) == len(ran) else '**does not hold**'}: ours at or below per-block's measured "
               f"peak ({len(mem)} of {len(ran)})")
    bit = [n for n, p in ran if p["ours"]["grad_max_abs_diff"] == 0.0 and p["peer"]["grad_max_abs_diff"] == 0.0]
    out.append(f"- {'holds' if len(bit) == len(ran) else '**does not hold**'}: gradients bitwise equal to the plain "
               f"step's, ours and per-block ({len(bit)} of {len(ran)})")
    errs = [(n, p["errors"].get("roofline"), p["errors"].get("flops")) for n, p in ran]
    better = [e for e in errs if e[1] is not None and e[2] is not None and e[1] < e[2]]
    out.append(f"- {'holds' if errs and len(better) == len(errs) else '**does not hold**'}: roofline's prediction "
               "error (|pred - meas| of the extra time, per-block and ours summed) below FLOPs' on every model ("
               + ", ".join(f"{n} {_ms(r)} vs {_ms(f)} ms" for n, r, f in errs) + ")")
    return out


def main(quick: bool = False) -> None:
    doc = run(quick=quick)
    with open(out_dir(quick) / "selective.json", "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    path = write_page("selective.md", TITLE, report(doc), quick=quick)
    log.info("selective: wrote %s and its .json", path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main()
