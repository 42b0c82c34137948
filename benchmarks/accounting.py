"""Predicted vs allocator peaks at the shapes that exposed issue 23's accounting bugs ("off by a tensor").

Not part of ``make bench``: the timm rows need timm (and torchvision), which
this project does not depend on. In the throwaway venv of
``benchmarks/thirdparty_vision.py`` (it has transformers too)::

    /tmp/tpv/bin/python -m benchmarks.accounting            # all rows, from the repository root
    /tmp/tpv/bin/python -m benchmarks.accounting hf-t5      # one model

Rows (default traces: op workspaces measured, roofline costs):

* ``timm-vit-s``: ``vit_small_patch16_224(img_size=128)``, batch 8: ``dp``'s
  default (selective) plan at its least feasible budget and at 190,000,000 B;
* ``timm-vit-b``: ``vit_base_patch16_224(img_size=128)``, batch 8, store-all;
* ``hf-vit``: transformers ViT at base widths, 4 layers, batch 8, 224 px:
  ``dp``'s plan at the peak of transformers' own checkpointing (non-reentrant);
* ``hf-t5``: T5, 4 + 4 layers at t5-small widths, batch 4, 128 / 64 tokens:
  store-all, ``ilp`` at its least feasible budget, transformers' checkpointing.

Writes ``benchmarks/results/accounting.md`` (``benchmarks.pages``: with the commit, machine and command).
"""

import sys

import torch
import torch.nn.functional as F

import scheduler
import scheduler.applying  # noqa: F401  (NOTE [ Recompute timed in the step ]: traces measure their step)
from scheduler.measuring.steps import allocator_step_peak
from scheduler.tracing.tracer import capture
from solvers import InfeasibleBudget, simulate

from benchmarks.pages import write_page

torch.set_num_threads(2)


def _timm(name):
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=128).train()
    x, y = torch.randn(8, 3, 128, 128), torch.zeros(8, dtype=torch.long)
    return model, (x,), {}, lambda out: F.cross_entropy(out, y)


def _hf(config, cls, inputs, **kw):
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, config)(**kw)
    return getattr(transformers, cls)(cfg).train(), (), inputs(cfg), lambda out: out.loss


def _vit_inputs(cfg):
    return {"pixel_values": torch.randn(8, 3, 224, 224), "labels": torch.randint(0, 10, (8,))}


def _t5_inputs(cfg):
    return {"input_ids": torch.randint(0, cfg.vocab_size, (4, 128)), "labels": torch.randint(0, cfg.vocab_size, (4, 64))}


def _peak(model, args, kwargs, loss):
    torch.manual_seed(0)
    return allocator_step_peak(model, model, args, kwargs, loss)


def _transformers_peak(model, args, kwargs, loss):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        return _peak(model, args, kwargs, loss)
    finally:
        model.gradient_checkpointing_disable()


def _least(graph, solver):
    try:
        scheduler.solve(graph, 1 << 20, solver=solver)
    except InfeasibleBudget as exc:
        return exc.min_feasible_bytes
    raise AssertionError("a 1 MiB budget fitted")


def _plan_row(name, model, args, kwargs, loss, graph, budget, solver, what):
    plan = scheduler.solve(graph, budget, solver=solver)
    predicted = simulate(graph, plan).peak_bytes
    scheduler.apply(model, plan)
    try:
        measured = _peak(model, args, kwargs, loss)
    finally:
        scheduler.remove(model)
    kept = sorted({graph.nodes[k].module.rsplit(".", 1)[-1] for k in plan.saved})
    return (name, f"{solver} at {what}", budget, predicted, measured, f"{len(plan.regions)} regions, kept {kept or '-'}")


def run(name):
    rows = []
    if name.startswith("timm"):
        model, args, kwargs, loss = _timm("vit_small_patch16_224" if name == "timm-vit-s" else "vit_base_patch16_224")
    elif name == "hf-vit":
        model, args, kwargs, loss = _hf("ViTConfig", "ViTForImageClassification", _vit_inputs, hidden_size=768,
                                        num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072,
                                        image_size=224, patch_size=16, num_labels=10)
    else:
        model, args, kwargs, loss = _hf("T5Config", "T5ForConditionalGeneration", _t5_inputs, d_model=512, d_ff=2048,
                                        num_layers=4, num_heads=8, d_kv=64, vocab_size=32128,
                                        decoder_start_token_id=0, pad_token_id=0)
    graph = capture(model, args, kwargs, loss=loss).graph
    store_all = simulate(graph).peak_bytes
    rows.append((name, "store-all", None, store_all, _peak(model, args, kwargs, loss), ""))
    if name == "timm-vit-s":
        least = _least(graph, "dp")
        rows.append(_plan_row(name, model, args, kwargs, loss, graph, least, "dp", "least feasible"))
        rows.append(_plan_row(name, model, args, kwargs, loss, graph, 190_000_000, "dp", "190,000,000 B"))
    elif name == "hf-vit":
        theirs = _transformers_peak(model, args, kwargs, loss)
        rows.append((name, "transformers' checkpointing", None, None, theirs, "every layer"))
        rows.append(_plan_row(name, model, args, kwargs, loss, graph, theirs, "dp", "transformers' peak"))
    elif name == "hf-t5":
        rows.append(_plan_row(name, model, args, kwargs, loss, graph, _least(graph, "ilp"), "ilp", "least feasible"))
        rows.append((name, "transformers' checkpointing", None, None, _transformers_peak(model, args, kwargs, loss),
                     "every block"))
    return rows


def _bytes(v):
    return "-" if v is None else f"{v:,}"


def main(names):
    lines = ["| model | step | budget | predicted | allocator | allocator - predicted | plan |", "|---|---|---|---|---|---|---|"]
    for name in names:
        for row in run(name):
            model, step, budget, predicted, measured, plan = row
            diff = "-" if predicted is None else f"{measured - predicted:+,}"
            lines.append(f"| {model} | {step} | {_bytes(budget)} | {_bytes(predicted)} | {_bytes(measured)} | {diff} | {plan} |")
            print(lines[-1], flush=True)
    write_page("accounting.md", "Off by a tensor: predicted vs allocator peaks",
               ["Predicted: `simulate` of the traced graph (op workspaces measured); allocator: the profiler's peak "
                "of one real CPU step (`scheduler.measuring.steps.allocator_step_peak`).", "", *lines])


if __name__ == "__main__":
    main(sys.argv[1:] or ["timm-vit-s", "timm-vit-b", "hf-vit", "hf-t5"])
