"""A chunk menu on a classifier whose loss has no chunked form (issue 33: the levers page had 5 plans `apply`
refused: a transformers ViT, timm and torchvision models solved with chunks got a chunked head, and `apply` then
said "ViTForImageClassification is neither [a causal-LM nor a masked-LM]"). The trace records which submodules
are such LMs (NOTE [ Which heads run in chunks ]); the menu leaves any other head whole and says why."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import scheduler  # noqa: E402
from graphs import LM_HEADS_META  # noqa: E402
from solvers.model.chunks import ChunkError, find_tail  # noqa: E402


def _vit():
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 image_size=16, patch_size=4, num_labels=10)
    model = transformers.ViTForImageClassification(cfg).train()
    return model, {"pixel_values": torch.randn(4, 3, 16, 16), "labels": torch.randint(0, 10, (4,))}


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=200, n_positions=16)
    ids = torch.randint(0, 200, (2, 16))
    return transformers.GPT2LMHeadModel(cfg).train(), {"input_ids": ids, "labels": ids}


def test_a_classifier_head_is_left_whole_and_the_plan_applies_and_trains():
    model, batch = _vit()
    twin = copy.deepcopy(model)
    graph = scheduler.trace(model, (), batch, loss=lambda out: out.loss)
    assert graph.meta[LM_HEADS_META] == {}
    with pytest.raises(ChunkError, match="ViTForImageClassification is neither"):
        find_tail(graph)
    # before: a plan with the head in chunks, which apply refused (ChunkedHeadError); now the menu names why
    with pytest.raises(ChunkError, match="the head is not chunked: .*ViTForImageClassification is neither"):
        scheduler.solve(graph, 0.8, chunks=(1, 2, 4))
    plan = scheduler.solve(graph, 0.8, chunks=(1, 2, 4), mlp_chunks=(1, 2))  # the MLPs may still run in chunks
    assert all(not path.endswith("+loss") for path in plan.chunk_modules)
    scheduler.apply(model, plan)
    model(**batch).loss.backward()
    twin(**batch).loss.backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert ((p.grad - q.grad).abs().max() <= 1e-6 * q.grad.abs().max()).item(), name


def test_a_causal_lm_head_is_still_chunked():
    model, batch = _gpt2()
    graph = scheduler.trace(model, (), batch, loss=lambda out: out.loss)
    assert graph.meta[LM_HEADS_META] == {"": "causal"}
    assert find_tail(graph).head == "lm_head"


def test_the_record_is_no_part_of_the_fingerprint():
    model, batch = _gpt2()
    graph = scheduler.trace(model, (), batch, loss=lambda out: out.loss)
    bare = graph.from_dict({**graph.to_dict(), "meta": {k: v for k, v in graph.meta.items() if k != LM_HEADS_META}})
    assert bare.fingerprint() == graph.fingerprint()
    find_tail(bare)  # a graph without the record (an older file) reads as before
