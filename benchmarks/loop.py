"""The user's loop: plans solved for each loop, measured in each loop style (NOTE [ The user's loop ] in ``graphs.graph``).

``out = model(**batch); out.loss.backward()`` keeps the model's output (logits and all) through the backward;
``Trainer`` and ``loss = model(**batch).loss`` drop it first. For three transformers models built from configs
(random weights, offline), the budget is half the store-all activations of the held loop (or its least feasible
budget when higher), beside the peaks transformers' own ``gradient_checkpointing_enable()`` measures in each loop;
``ilp`` solves the graph traced for each loop at that budget, and each
plan runs a real step in each loop style, measured by the allocator (the profiler's memory events, what "fits"
means) and by live tensor storages (what ``simulate`` counts), beside its prediction for that loop.

Writes ``benchmarks/results/loop.json`` and ``loop.md``. Run: ``python -m benchmarks.run --only loop``
(``--quick``: the smallest model only).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

import torch

import scheduler
import solvers
from scheduler.measuring.steps import allocator_step_peak, measure_step_peak
from scheduler.sizing.budget import format_bytes

from benchmarks.pages import out_dir, write_page

log = logging.getLogger(__name__)
LOOPS = ("held", "dropped")
FRACTION = 0.5


def _loss(out: Any) -> torch.Tensor:
    return out.loss


def llama():
    """The issue's Llama: 4 layers, width 256, vocabulary 32000."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=32000, use_cache=False)
    ids = torch.randint(0, cfg.vocab_size, (2, 128))
    return transformers.LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids}


def gpt2():
    """GPT-2 small's shape (``hf:gpt2``, width 768, vocabulary 50257) cut to 4 layers, sequence 512."""
    from scheduler.models.hf_configs import build_hf_model, hf_config

    cfg = hf_config("gpt2", n_layer=4, use_cache=False)
    ids = torch.randint(0, cfg.vocab_size, (1, 512))
    return build_hf_model(cfg, device="cpu"), {"input_ids": ids, "labels": ids}


def bert():
    """BERT-MLM with BERT's vocabulary (30522), 3 layers of width 128."""
    import transformers

    cfg = transformers.BertConfig(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, intermediate_size=512)
    ids = torch.randint(0, cfg.vocab_size, (2, 128))
    return transformers.BertForMaskedLM(cfg), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


MODELS: dict[str, Callable[[], tuple]] = {f.__name__: f for f in (llama, gpt2, bert)}


def _peaks(module: Any, model: Any, kwargs: dict, loop: str) -> tuple[int, int]:
    """(allocator peak, live-storage peak) of one step in ``loop``."""
    torch.manual_seed(0)
    alloc = allocator_step_peak(module, model, (), kwargs, _loss, loop=loop)
    torch.manual_seed(0)
    return alloc, measure_step_peak(module, model, (), kwargs, _loss, loop=loop)


def run_one(name: str, *, time_limit_s: float = 30.0) -> dict:
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    model.train()
    t0 = time.perf_counter()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    hf = {loop: _peaks(model, model, kwargs, loop) for loop in LOOPS}
    model.gradient_checkpointing_disable()
    graph = scheduler.trace(model, (), kwargs, loss=_loss)  # loop="held", the default
    try:  # half the store-all activations of the held loop, or its least feasible budget when higher
        budget = solvers.activation_budget_bytes(graph, FRACTION)
        scheduler.solve(graph, budget, solver="ilp", time_limit_s=time_limit_s)
    except solvers.InfeasibleBudget as exc:
        budget = exc.min_feasible_bytes
    row: dict[str, Any] = {"model": name, "params": sum(p.numel() for p in model.parameters()),
                           "held_output_bytes": sum(graph.nodes[k].out_bytes for k in graph.held_outputs()),
                           "budget_bytes": budget, "hf_checkpointing": {loop: hf[loop][0] for loop in LOOPS},
                           "plans": {}}
    for solved_for in LOOPS:
        g = graph.with_loop(solved_for)
        plan = scheduler.solve(g, budget, solver="ilp", time_limit_s=time_limit_s)
        entry = {"regions": len(plan.regions), "status": plan.status, "runs": {}}
        for run_as in LOOPS:
            predicted = solvers.simulate(graph.with_loop(run_as), plan, record=False).peak_bytes
            scheduler.apply(model, plan)
            try:
                alloc, counted = _peaks(model, model, kwargs, run_as)
            finally:
                scheduler.remove(model)
            entry["runs"][run_as] = {"predicted": predicted, "allocator": alloc, "storages": counted,
                                     "allocator_vs_budget_pct": 100 * (alloc - budget) / budget}
        row["plans"][solved_for] = entry
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def _table(rows: list[dict]) -> str:
    out = ["Transformers models built from configs (random weights). The budget is half the held loop's store-all "
           "activations or, above that, its least feasible budget; `ilp` solves the graph for each loop at it, and "
           "each plan runs a step in each loop style (`held`: the output kept through `backward()`; `dropped`: "
           "freed first), measured by the allocator (the profiler's events) and by live tensor storages.", "",
           "| model | plan solved for | step run as | predicted | allocator | storages | allocator vs budget |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        hf = r["hf_checkpointing"]
        out.append(f"| {r['model']}: budget {format_bytes(r['budget_bytes'])}; transformers' checkpointing "
                   f"{format_bytes(hf['held'])} held, {format_bytes(hf['dropped'])} dropped | | | | | | |")
        for solved_for, entry in r["plans"].items():
            for run_as, m in entry["runs"].items():
                out.append(f"| | {solved_for} ({entry['regions']} regions) | {run_as} | {format_bytes(m['predicted'])} "
                           f"| {format_bytes(m['allocator'])} | {format_bytes(m['storages'])} "
                           f"| {m['allocator_vs_budget_pct']:+.1f}% |")
    return "\n".join(out) + "\n"


def main(quick: bool = False, names: list[str] | None = None) -> None:
    names = names or (["bert"] if quick else list(MODELS))
    rows = []
    for name in names:
        log.info("loop: %s", name)
        rows.append(run_one(name))
    (out_dir(quick) / "loop.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_page("loop.md", "The user's loop: a plan per loop, each step run in both", _table(rows), quick=quick)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main()
