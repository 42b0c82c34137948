"""Plans applied onto the user's module: other shapes, and the price of alignment on real models.

For a transformers GPT-2 (small config), a transformers ViT and the built-in
ResNet (BatchNorm, dropout on): trace at the largest shape, solve with ``ilp``
at per-module's own peak (module-aligned), apply onto the model itself, then
run real steps at that shape and at three smaller ones: each step's
allocator peak (profiler memory events) against the prediction for the
largest shape, and its gradients against the same step without the plan.

Then the price of alignment: the ``ilp`` optimum over module-aligned plans
(what can be applied onto the module) against the optimum over every interval
plan (``graph.unaligned()``, applicable only through the traced-graph
fallback), at 0.3 and 0.5 of store-all.

Writes ``benchmarks/results/apply_shapes.md`` and ``.json``. Run:
``python -m benchmarks.run --only apply_shapes``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

import torch

import scheduler
import solvers
from scheduler.sizing.budget import format_bytes
from scheduler.measuring.steps import allocator_step_peak
from solvers import InfeasibleBudget, activation_budget_bytes, simulate

from benchmarks.pages import out_dir, seconds, write_page

log = logging.getLogger(__name__)


def _hf_loss(out: Any) -> torch.Tensor:
    return out.loss


def _gpt2():
    import transformers

    cfg = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=256, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).train()

    def batch(b: int, s: int) -> tuple[tuple, dict]:
        ids = torch.randint(0, 512, (b, s), generator=torch.Generator().manual_seed(b * 1000 + s))
        return (), {"input_ids": ids, "labels": ids}

    return model, batch, _hf_loss, [(4, 256), (4, 128), (2, 256), (1, 77)]


def _vit():
    import transformers

    cfg = transformers.ViTConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256,
                                 image_size=64, patch_size=4, num_labels=10)
    model = transformers.ViTForImageClassification(cfg).train()

    def batch(b: int, _s: int) -> tuple[tuple, dict]:
        g = torch.Generator().manual_seed(b)
        return (), {"pixel_values": torch.randn(b, 3, 64, 64, generator=g), "labels": torch.randint(0, 10, (b,), generator=g)}

    return model, batch, _hf_loss, [(8, 0), (6, 0), (4, 0), (1, 0)]


def _resnet():
    from scheduler.models import build

    ex = build("resnet", batch=8, image_size=64)

    def batch(b: int, s: int) -> tuple[tuple, dict]:
        g = torch.Generator().manual_seed(b * 1000 + s)
        return (torch.randn(b, 3, s, s, generator=g), torch.randint(0, 10, (b,), generator=g)), {}

    return ex.model, batch, None, [(8, 64), (4, 64), (8, 48), (2, 32)]


MODELS: dict[str, Callable[[], tuple]] = {"hf-gpt2": _gpt2, "hf-vit": _vit, "resnet": _resnet}


def _grads_equal(model, plan, args, kwargs, loss) -> bool:
    def step():
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(0)
        out = model(*args, **kwargs)
        (loss(out) if loss else out).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    buffers = [b.clone() for b in model.buffers()]
    scheduler.remove(model)
    g0 = step()
    with torch.no_grad():
        for b, s in zip(model.buffers(), buffers):
            b.copy_(s)
    scheduler.apply(model, plan)
    g1 = step()
    with torch.no_grad():
        for b, s in zip(model.buffers(), buffers):
            b.copy_(s)
    return len(g0) == len(g1) and all(torch.equal(a, b) for a, b in zip(g0, g1))


def run_model(name: str) -> dict:
    torch.manual_seed(0)
    model, batch, loss, shapes = MODELS[name]()
    args, kwargs = batch(*shapes[0])
    graph = scheduler.trace(model, args, kwargs, loss=loss)
    per_block = solvers.solve(graph, 1 << 60, solver="per-module")
    plan = scheduler.solve(graph, per_block.peak_bytes, solver="ilp", time_limit_s=60)
    predicted = simulate(graph, plan).peak_bytes
    rows = []
    for b, s in shapes:
        args, kwargs = batch(b, s)
        equal = _grads_equal(model, plan, args, kwargs, loss)
        scheduler.apply(model, plan)
        peak = allocator_step_peak(model, model, args, kwargs, loss)
        scheduler.remove(model)
        rows.append({"shape": [b, s], "allocator_peak": peak, "grads_equal": equal})
    price = []
    for frac in (0.3, 0.5):
        budget = activation_budget_bytes(graph, frac)
        entry: dict[str, Any] = {"fraction": frac, "budget": budget}
        for key, g in (("aligned", graph), ("unaligned", graph.unaligned())):
            t0 = time.perf_counter()
            try:
                p = solvers.solve(g, budget, solver="ilp", time_limit_s=60)
                sim = simulate(g, p)
                entry[key] = {"recompute_pct": round(100 * sim.recompute_ratio, 2), "recompute_s": sim.recompute_time_s,
                              "status": str(p.status), "regions": len(p.regions),
                              "seconds": round(time.perf_counter() - t0, 2)}
            except InfeasibleBudget as exc:
                entry[key] = {"infeasible": exc.min_feasible_bytes}
        price.append(entry)
    return {"model": name, "nodes": len(graph), "spans": len(graph.spans), "regions": len(plan.regions),
            "modules": list(plan.modules), "predicted_largest": predicted, "budget": per_block.peak_bytes,
            "shapes": rows, "price": price}


def _cell(e: dict) -> str:
    if "infeasible" in e:
        return f"infeasible (needs {format_bytes(e['infeasible'])})"
    secs = "" if e.get("recompute_s") is None else f", {seconds(e['recompute_s'])}"
    return f"{e['recompute_pct']}%{secs} ({e['status']}, {e['regions']} regions, {e['seconds']} s)"


def main(quick: bool = False) -> None:
    results = [run_model(name) for name in MODELS]
    (out_dir(quick) / "apply_shapes.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["Each model is traced at its largest "
             "shape, solved with `ilp` at per-module's own peak over module-aligned plans, and applied onto the "
             "model itself (`scheduler.apply`). Peaks: the allocator's (profiler memory events) for one real step; "
             "gradients: bitwise against the same step without the plan.", "",
             "| model | shape (batch, seq or side) | allocator peak | predicted at the largest shape | at or below | "
             "gradients equal |", "|---|---|---|---|---|---|"]
    for r in results:
        for row in r["shapes"]:
            lines.append(f"| {r['model']} | {tuple(row['shape'])} | {format_bytes(row['allocator_peak'])} | "
                         f"{format_bytes(r['predicted_largest'])} | "
                         f"{'yes' if row['allocator_peak'] <= r['predicted_largest'] else 'NO'} | "
                         f"{'yes' if row['grads_equal'] else 'NO'} |")
    lines += ["", "Regions: " + "; ".join(f"{r['model']}: {', '.join(r['modules'])}" for r in results), "",
              "## The price of alignment", "",
              "`ilp` over module-aligned plans (applied onto the module) vs over every interval plan (only the "
              "traced-graph fallback can run those); recompute FLOPs as % of the step, and the predicted recompute "
              "time (the roofline cost at the graph's rate: what `ilp` minimises).", "",
              "| model | nodes | spans | budget | aligned | unaligned |", "|---|---|---|---|---|---|"]
    for r in results:
        for e in r["price"]:
            lines.append(f"| {r['model']} | {r['nodes']} | {r['spans']} | {e['fraction']} "
                         f"({format_bytes(e['budget'])}) | {_cell(e['aligned'])} | {_cell(e['unaligned'])} |")
    write_page("apply_shapes.md", "Plans applied onto the module: other shapes, and the price of alignment", lines,
               quick=quick)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
