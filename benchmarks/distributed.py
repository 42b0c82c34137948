"""Plans for distributed training: every rank predicted against a measured step, and Llama-2 layouts on meta.

1. A transformers ``GPT2LMHeadModel`` (a small config, held as a
   ``scheduler.models.staged.StagedLM`` so that a stage keeps its module
   paths) on gloo, 4 CPU processes started once: FSDP2 over 2 and 4 ranks,
   2- and 4-stage pipelines under GPipe and 1F1B
   (``torch.distributed.pipelining``), each store-all and with the stage
   plans ``solve_layout`` finds at a tighter card. Per rank: the predicted
   peak, the allocator's measured peak (NOTE [ Measuring a rank ]) and the
   gradients against one process stepping the whole batch.
2. Llama-2-7B and -70B (``hf:llama-2-7b``, ``hf:llama-2-70b``) on the meta
   device, bf16 with AdamW mixed precision, micro-batch 1 at sequence 4096,
   on an 80 GiB card with the 5 % reserve: per layout and stage, the
   micro-batches in flight, the rank's predicted peak, the recompute and
   the plan, and the smallest card.

Writes ``benchmarks/results/distributed.md`` (through ``benchmarks.pages.write_page``: its header names the
commit, date, machine and command, NOTE [ Results pages ]) and one JSON per part (``distributed_measured.json``,
``distributed_llama-2-7b.json``, ``distributed_llama-2-70b.json``). ``make bench`` (or ``python -m
benchmarks.run --only distributed``) runs every part in turn (``--quick``: the measured part and the 7B table,
under ``results/quick/``); ``python -m benchmarks.distributed PART...`` runs the parts named and writes their
JSON only (in separate processes if one likes, at one commit), and ``--render`` writes the page from the JSON
there, refusing parts measured at another commit than the page would name.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

log = logging.getLogger("benchmarks.distributed")
CARD = "80GiB"
BATCH, SEQ, MICROBATCHES = 8, 64, 4
CONFIG = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=1024, n_positions=SEQ)
#: The smallest card of the Llama layouts is bisected to this share of its upper bound (the library's default is
#: finer: ``scheduler.distributed.fit.CARD_TOLERANCE``); each inner solve is limited to ``TIME_LIMIT_S``.
CARD_SHARE, TIME_LIMIT_S = 0.01, 60
PARTS = ("measured", "llama-2-7b", "llama-2-70b")
LLAMA_LAYOUTS = {
    "hf:llama-2-7b": [dict(shard=8), dict(shard=8, tp=2, sequence_parallel=True),
                      dict(shard=4, pp=2, microbatches=8), dict(pp=4, microbatches=8, schedule="gpipe"),
                      dict(pp=4, microbatches=8), dict(pp=2, virtual_stages=2, microbatches=8,
                                                       schedule="interleaved-1f1b")],
    "hf:llama-2-70b": [dict(shard=64), dict(shard=8, tp=8, sequence_parallel=True),
                       dict(shard=8, tp=2, pp=4, microbatches=16),
                       dict(tp=8, pp=8, microbatches=32, schedule="gpipe"), dict(tp=8, pp=8, microbatches=32)],
}


def gpt2_small():
    """The measured model: a small ``GPT2LMHeadModel`` as a ``StagedLM`` (seeded)."""
    import torch

    from scheduler.models.staged import staged_gpt2

    torch.manual_seed(0)
    return staged_gpt2(**CONFIG)


def _batch():
    import torch

    g = torch.Generator().manual_seed(1)
    v = CONFIG["vocab_size"]
    return torch.randint(0, v, (BATCH, SEQ), generator=g), torch.randint(0, v, (BATCH, SEQ), generator=g)


gpt2_small.batch = _batch  # type: ignore[attr-defined]


def measured() -> dict:
    """Part 1: predicted and measured peaks of every rank, store-all and with the plans of a tighter card."""
    import scheduler
    from scheduler.distributed import Layout, solve_layout
    from scheduler.distributed.stages import stage_starts
    from scheduler.measuring.distributed import FsdpRun, PipelineRun, run_distributed, single_process_grads

    spec = "benchmarks.distributed:gpt2_small"
    model = gpt2_small()
    x, y = _batch()
    t0 = time.perf_counter()
    graphs = {b: scheduler.trace(model, (x[:b], y[:b])) for b in (BATCH // 4, BATCH // 2)}
    trace_s = time.perf_counter() - t0
    # gloo: gathers in order, and its 2 worker threads may keep finished collectives (NOTE [ FSDP2's buffers ])
    layouts = [Layout(shard=s, forward_prefetch=0, collective_threads=2) for s in (2, 4)]
    layouts += [Layout(pp=s, microbatches=MICROBATCHES, schedule=k) for s in (2, 4) for k in ("gpipe", "1f1b")]
    units = tuple(f"layers.{i}" for i in range(CONFIG["n_layer"]))
    cases, runs = [], []
    for layout in layouts:
        graph = graphs[BATCH // layout.shard if layout.pp == 1 else BATCH // MICROBATCHES]
        full = solve_layout(graph, "1GiB", layout)
        tight = solve_layout(graph, int(0.85 * full.peak_bytes), layout, strict=False)
        for label, plans in (("store-all", full), ("plan at 0.85", tight)):
            if layout.pp == 1:
                runs.append(FsdpRun(layout.shard, units, plans.stages[0].plan))
            else:
                runs.append(PipelineRun(stage_starts(graph, layout), layout.schedule, MICROBATCHES,
                                        tuple(s.plan for s in plans.stages)))
            cases.append((layout, label, plans))
    t0 = time.perf_counter()
    results = run_distributed(spec, 4, runs)
    run_s = time.perf_counter() - t0
    reference = single_process_grads(spec)
    rows = []
    for (layout, label, plans), result in zip(cases, results):
        worst = max((result.grads[k] - reference[k]).abs().max().item() for k in reference)
        for s in plans.stages:  # FSDP: one stage, every rank of the group; a pipeline: rank k runs stage k
            for rank in (range(layout.shard) if layout.pp == 1 else (s.index,)):
                rows.append({"layout": layout.describe(), "case": label, "stage": s.index, "rank": rank,
                             "inflight": s.inflight, "card_bytes": plans.budget_bytes, "predicted_bytes": s.peak_bytes,
                             "measured_bytes": result.peak(rank), "plan": _plan_text(s),
                             "grad_max_abs_diff": worst, "grads": len(result.grads) == len(reference)})
    return {"config": dict(CONFIG), "batch": BATCH, "seq": SEQ, "microbatches": MICROBATCHES,
            "trace_s": round(trace_s, 1), "run_s": round(run_s, 1), "rows": rows}


def _plan_text(stage) -> str:  # noqa: ANN001  (a StagePlan)
    from scheduler.report import compact_modules

    plan = stage.plan
    if plan is None:  # "no plan", or "stopped at the time limit (no plan found in 60 s)"
        return stage.no_plan_text
    return "store everything" if not plan.regions else compact_modules(plan.modules)


def llama(name: str) -> dict:
    """Part 2: Llama-2 layouts on meta: each stage's plan, recompute, peak, and the smallest card."""
    from scheduler.distributed import Layout, solve_layout
    from scheduler.distributed.fit import least_card
    from scheduler.models import build
    from scheduler.report import describe_target
    from scheduler.tracing.tracer import capture

    out = []
    t0 = time.perf_counter()
    ex = build(name, device="meta", dtype="bfloat16", batch=1, seq=4096)
    graph = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op", name=name).graph
    trace_s = time.perf_counter() - t0
    layouts = LLAMA_LAYOUTS[name]
    for spec in layouts:
        layout = Layout(**spec)
        t0 = time.perf_counter()
        plans = solve_layout(graph, CARD, layout, optimizer="adamw", mixed_precision=True, reserve="5%",
                             strict=False, time_limit_s=TIME_LIMIT_S)
        solve_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        card = least_card(graph, layout, optimizer="adamw", mixed_precision=True, reserve="5%", tolerance=CARD_SHARE,
                          time_limit_s=TIME_LIMIT_S)
        card_s = time.perf_counter() - t0
        for s in plans.stages:
            step = s.graph.total_fwd_flops() + s.graph.total_bwd_flops()
            out.append({"model": name, "layout": layout.describe(), "stage": s.index, "modules": list(s.modules),
                        "inflight": s.inflight, "inflight_reason": s.inflight_reason,
                        "peak_bytes": s.peak_bytes, "needs_bytes": s.needs_bytes,
                        "outside_bytes": s.state.outside_simulation_bytes if s.state else 0,
                        "recompute": None if s.plan is None else (s.plan.recompute_flops or 0) / step,
                        "status": None if s.plan is None else s.plan.status, "plan": _plan_text(s),
                        "stopped": s.stopped or None,
                        "card_bytes": card.card_bytes, "card_below_bytes": card.below_bytes,
                        "trace_s": round(trace_s, 1), "solve_s": round(solve_s, 1), "card_s": round(card_s, 1)})
        log.info("%s %s: %s in %.1fs, smallest card %s", name, layout.describe(),
                 "fits" if plans.fits else "does not fit", solve_s, card.card_bytes)
    return {"model": name, "card": CARD, "target": describe_target(graph.meta.get("target")), "rows": out}


def _gib(n: int | None) -> str:
    return "—" if n is None else f"{n / (1 << 30):.2f} GiB"


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / (1 << 20):.2f} MiB"


TITLE = "Plans for distributed training"


def _parts_line(data: dict) -> list[str]:
    ran = data["ran"]
    suite = "python -m benchmarks.run --only distributed"
    parts = "; ".join(f"`{r['part']}` {r['elapsed_s']:.0f} s"
                      + ("" if r["command"].startswith(suite) else f" (`{r['command']}`)") for r in ran)
    return [f"Parts, each with the time it took: {parts}."]


def render(data: dict) -> str:
    """The page's body (its title and header are :func:`benchmarks.pages.write_page`'s)."""
    lines = [*_parts_line(data), ""]
    m = data.get("measured")
    if m is not None:
        lines += _render_measured(m)
    llamas = [data[k] for k in PARTS[1:] if data.get(k) is not None]
    if llamas:
        lines += _render_llama(llamas)
    return "\n".join(lines) + "\n"


def _render_measured(m: dict) -> list[str]:
    lines = ["## Every rank, predicted and measured (gloo, CPU processes)", "",
             f"transformers `GPT2LMHeadModel` ({', '.join(f'{k}={v}' for k, v in m['config'].items())}, untied head, "
             f"no dropout) as a `StagedLM`; batch {m['batch']} x seq {m['seq']}, fp32. FSDP2: `fully_shard` on each "
             f"block and the model, the batch split over the ranks; pipelines: {m['microbatches']} micro-batches, "
             "one stage per process, cut where `solve_layout` balances them. Predicted: each rank's peak "
             "(`StagePlan.peak_bytes`); measured: its allocator peak over one step after a warm-up (profiler "
             "events, plus what was alive before: parameter shards, inputs, the pipeline's receive buffers). "
             "`plan at 0.85`: the plans of a card of 0.85 of the largest rank's store-all prediction (a stage "
             "without a plan there ran without one). Gradients: the largest absolute difference from one process "
             f"stepping the whole batch. 4 processes started once ran every row in {m['run_s']:.0f} s (tracing "
             f"{m['trace_s']:.0f} s).", "",
             "| layout | case | rank | in flight | predicted | measured | predicted - measured | plan | gradients vs one process |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = [r for r in m["rows"] if r["predicted_bytes"] is not None]
    under = [r for r in rows if r["measured_bytes"] <= r["predicted_bytes"]]
    over = [r for r in rows if r["measured_bytes"] > r["predicted_bytes"]]
    lines[-2:-2] = [f"**{len(under)} of {len(rows)} rank measurements at or below their prediction**"
                    + ("" if not over else "; over: " + ", ".join(
                        f"{r['layout']} {r['case']} rank {r.get('rank', r['stage'])} by "
                        f"{r['measured_bytes'] - r['predicted_bytes']:,} B" for r in over))
                    + f"; the prediction at most {max(100 * (r['predicted_bytes'] / r['measured_bytes'] - 1) for r in rows):.2f} % "
                    "above the measure. FSDP2 over 2 ranks ran in both pairs of the 4 processes at once: a rank's "
                    "measure is the higher of its two.", ""]
    for r in m["rows"]:
        if r["predicted_bytes"] is None:
            diff = "no plan: not predicted"
        else:
            diff = f"{100 * (r['predicted_bytes'] - r['measured_bytes']) / r['measured_bytes']:+.2f}%"
        grads = f"max abs diff {r['grad_max_abs_diff']:.1e}" + ("" if r["grads"] else ", some missing")
        lines.append(f"| {r['layout']} | {r['case']} | {r.get('rank', r['stage'])} | {r['inflight']} | {_mib(r['predicted_bytes'])} | "
                     f"{_mib(r['measured_bytes'])} | {diff} | {r['plan']} | {grads} |")
    return lines + [""]


def _render_llama(parts: list[dict]) -> list[str]:
    lines = ["## Llama-2 layouts on the meta device", "",
             f"Op-granularity traces (`scheduler.models.build(..., device='meta', dtype='bfloat16')`, planned for "
             f"{parts[0]['target']}), micro-batch 1 at seq 4096; a card of {parts[0]['card']} per rank with 5 % held "
             "back; AdamW under bf16 mixed precision (fp32 state and master copy, split over the FSDP ranks). `ilp` "
             f"per stage ({TIME_LIMIT_S} s limit per inner solve). Rank peak: what the rank holds at its peak (NOTE "
             "[ What a rank holds ]), optimizer state included; recompute: the stage's recompute FLOPs as a share "
             f"of its step; smallest card: bisected to {100 * CARD_SHARE:g} % of its upper bound "
             "(NOTE [ The smallest card ]).", "",
             f"| model | layout | stage | modules | in flight | fits {parts[0]['card']} | rank peak | recompute | plan | "
             "smallest card |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for part in parts:
        for r in part["rows"]:
            peak = _gib(r["peak_bytes"]) if r["peak_bytes"] is not None else (  # no plan, or stopped
                f"no plan (one at {_gib(r['needs_bytes'])} seen)" if r["plan"] == "no plan" and r["needs_bytes"]
                else r["plan"])
            rec = "—" if r["recompute"] is None else f"{100 * r['recompute']:.1f}% ({r['status']})"
            card = _gib(r["card_bytes"]) if r["card_bytes"] else f"none up to {_gib(r['card_below_bytes'])}"
            mods = " .. ".join(dict.fromkeys(r["modules"]))
            fits = "yes" if r["peak_bytes"] is not None else "**no**"
            lines.append(f"| {r['model']} | {r['layout']} | {r['stage']} | {mods} | {r['inflight']} | {fits} | {peak} | "
                         f"{rec} | {r['plan']} | {card} |")
    return lines + [""]


def _path(name: str, quick: bool = False) -> str:
    from benchmarks.pages import out_dir

    return os.path.join(out_dir(quick), f"distributed_{name}.json")


def _commit() -> str:
    """The commit the code runs at (``+dirty`` when tracked files differ from it), as a page's header names it."""
    from benchmarks.pages import _commit as commit  # noqa: PLC2701  (the header's own reading)

    return commit().strip("`")


def run_part(name: str, command: str, quick: bool = False) -> None:
    """Run one part and write its JSON (with the command, the commit it started on and the time it took)."""
    import torch

    commit = _commit()  # the code as it starts
    t0 = time.perf_counter()
    data = measured() if name == "measured" else llama(f"hf:{name}")
    data["ran"] = {"part": name, "command": command, "commit": commit, "torch": torch.__version__,
                   "elapsed_s": time.perf_counter() - t0}
    with open(_path(name, quick), "w") as f:
        json.dump(data, f, indent=1)
    log.info("%s: %.0f s, wrote %s", name, data["ran"]["elapsed_s"], _path(name, quick))


def render_page(quick: bool = False, command: str | None = None) -> str:
    """``distributed.md`` from the parts' JSON present, through ``benchmarks.pages.write_page``.

    Raises:
        ValueError: a part's JSON was measured at another commit than the page's header would name (or on a
            dirty tree), on a page that is not ``--quick``: run the parts again at this commit.
    """
    from benchmarks.pages import write_page

    data: dict = {}
    for name in PARTS:
        if os.path.exists(_path(name, quick)):
            with open(_path(name, quick)) as f:
                data[name] = json.load(f)
    if not data:
        raise ValueError(f"no part's JSON under {os.path.dirname(_path(PARTS[0], quick))}: run "
                         "python -m benchmarks.distributed PART first")
    for name, part in data.items():
        part["ran"].setdefault("part", name)
    data["ran"] = [data[n]["ran"] for n in PARTS if n in data]
    now = _commit()
    other = [r for r in data["ran"] if r["commit"] != now or now.endswith("+dirty")]
    if other and not quick:
        raise ValueError("the page's header names commit " + now + ", but " + ", ".join(
            f"part {r['part']} ran at {r['commit']}" for r in other) + ": run those parts again at this commit on "
            "a clean tree (python -m benchmarks.distributed PART), or the whole suite (python -m benchmarks.run "
            "--only distributed)")
    path = write_page("distributed.md", TITLE, render(data), quick=quick, command=command)
    log.info("wrote %s", path)
    return str(path)


def main(quick: bool = False) -> None:
    """``make bench``: every part in turn (``--quick``: the measured part and the 7B table), then the page."""
    for name in PARTS[:2] if quick else PARTS:
        run_part(name, "python -m benchmarks.run --only distributed" + (" --quick" if quick else ""), quick)
    render_page(quick)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parts", nargs="*", metavar="PART", help=f"the parts to run, of {', '.join(PARTS)}")
    p.add_argument("--render", action="store_true", help="write distributed.md from the parts' JSON")
    args = p.parse_args()
    if set(args.parts) - set(PARTS):
        p.error(f"unknown part {', '.join(sorted(set(args.parts) - set(PARTS)))}: choose from {', '.join(PARTS)}")
    for part in args.parts:
        run_part(part, f"python -m benchmarks.distributed {part}")
    if args.render:
        render_page()
    elif not args.parts:
        p.error("name the parts to run, or --render to write the page from their JSON")
