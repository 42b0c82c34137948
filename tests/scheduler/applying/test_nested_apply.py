"""Nested regions applied onto transformers models (NOTE [ Nested regions ] in solvers.model.nested): gradients
bitwise those of the plain step, the allocator's peak at or below the prediction, remove() restores the
model; with a chunked head, nesting plans below the least one-level plan and the step measures below it too."""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

import scheduler  # noqa: E402
from graphs import FUSED_HEADS_META  # noqa: E402
import solvers  # noqa: E402
from scheduler.applying.modules import region_wrappers  # noqa: E402
from scheduler.measuring.steps import allocator_step_peak  # noqa: E402
from solvers import InfeasibleBudget, Plan, simulate  # noqa: E402
from solvers.model.chunks import chunked_graph  # noqa: E402
from solvers.model.nested import inner_menu  # noqa: E402

VOCAB, BATCH, SEQ, LAYERS = 2000, 2, 64, 2


def _model(kind: str):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(cfg).train(), {"input_ids": ids, "labels": ids}, "transformer.h"
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=256, num_key_value_heads=2,
                                   num_hidden_layers=LAYERS, num_attention_heads=4, vocab_size=VOCAB)
    return transformers.LlamaForCausalLM(cfg).train(), {"input_ids": ids, "labels": ids}, "model.layers"


def _loss(out):
    return out.loss


def _step(model, kwargs):
    model.zero_grad(set_to_none=True)
    out = model(**kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_blocks_nested_keep_the_step_bitwise_and_fit_their_prediction(kind):
    model, kwargs, blocks_path = _model(kind)
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    plain_out, plain = _step(model, kwargs)
    blocks = [(sp.first, sp.last) for sp in graph.spans if sp.module in {f"{blocks_path}.{i}" for i in range(LAYERS)}]
    inner = [r for b in blocks for r in inner_menu(graph, *b)]
    assert len(blocks) == LAYERS and len(inner) >= 2 * LAYERS  # attention and MLP at least, in every block
    plan = Plan.from_regions(graph, blocks, inner=tuple(inner))
    assert set(plan.inner_modules) >= {f"{blocks_path}.0.mlp", f"{blocks_path}.1.mlp"}
    predicted = simulate(graph, plan).peak_bytes
    scheduler.apply(model, plan)
    paths = sorted(w.path for w in region_wrappers(model))
    assert paths == sorted(plan.modules + plan.inner_modules)
    out, grads = _step(model, kwargs)
    assert torch.equal(out.loss, plain_out.loss)
    assert grads.keys() == plain.keys() and all(torch.equal(grads[n], plain[n]) for n in plain)  # bitwise
    # One recompute each: an inner call that the outer's recompute makes runs as a checkpoint, not as a recompute.
    assert all(w.recomputes == 1 for w in region_wrappers(model))
    assert allocator_step_peak(model, model, (), kwargs, _loss) <= predicted
    scheduler.remove(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    again, grads = _step(model, kwargs)
    assert torch.equal(again.loss, plain_out.loss) and all(torch.equal(grads[n], plain[n]) for n in plain)


def test_nesting_goes_below_the_least_one_level_plan_with_a_chunked_head():
    model, kwargs, _ = _model("gpt2")
    graph = scheduler.trace(model, (), kwargs, loss=_loss)  # autograd's chunk loop (NOTE [ Fused head ]: not fused)
    graph = dataclasses.replace(graph, meta={**graph.meta, FUSED_HEADS_META: []})
    plain_out, plain = _step(model, kwargs)
    with pytest.raises(InfeasibleBudget) as info:  # the least one-level plan (ilp: exact), head in 8 chunks
        solvers.solve(chunked_graph(graph, 8), 1, solver="ilp")
    least = info.value.min_feasible_bytes
    plan = scheduler.solve(graph, least - 1, chunks=(8,), nested=True)
    assert plan.inner and plan.peak_bytes < least
    scheduler.apply(model, plan)
    out, grads = _step(model, kwargs)
    assert torch.allclose(out.loss, plain_out.loss, rtol=1e-6, atol=0)  # the chunks reassociate the loss's sum
    for name, g in grads.items():
        scale = plain[name].abs().max().clamp_min(1e-30)
        assert ((g - plain[name]).abs().max() / scale).item() <= 1e-6, name
    measured = allocator_step_peak(model, model, (), kwargs, _loss)
    assert measured <= plan.peak_bytes < least
    scheduler.remove(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
