"""A key/value cache a region's call reads as well as writes (NOTE [ Filled caches replayed ] in
``scheduler.applying.caches``).

peft's prefix tuning hands every decoder layer a ``DynamicCache`` already filled with the trained prefix's
keys and values. The call attends to them and appends its own; a recompute of that call must see the cache as
the forward did, not with the forward's keys appended (transformers' own checkpointing fails there in the
backward: "The size of tensor a (64) must match the size of tensor b (72)"), and dropping the cache changes the
step. Built here without peft: the same cache, filled by hand, with trained prefix tensors.
"""

from __future__ import annotations

import gc
import inspect
import warnings
import weakref

import pytest
import torch

import scheduler
from scheduler.applying import region_wrappers
from scheduler.applying.caches import CacheDropped, CacheReplay, CacheState
from scheduler.tracing.recorder import _unsliced
from solvers import Plan

transformers = pytest.importorskip("transformers")

PREFIX, SEQ, LAYERS = 4, 12, 2


class _Prefixed(torch.nn.Module):
    """A causal LM with a trained prefix, as peft's prefix tuning wraps one: each call builds a ``DynamicCache``
    filled with the prefix's keys and values and passes it to the model."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        self.prefix = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(2, 2, PREFIX, 16)) for _ in range(2 * LAYERS))
        self.cache_arg = "cache" if "cache" in inspect.signature(type(lm).forward).parameters else "past_key_values"
        self.lengths: list[int] = []

    def forward(self, input_ids, labels):
        cache = transformers.DynamicCache()
        for i in range(LAYERS):
            cache.update(self.prefix[2 * i], self.prefix[2 * i + 1], i)
        mask = torch.ones(input_ids.shape[0], PREFIX + input_ids.shape[1])
        out = self.lm(input_ids=input_ids, labels=labels, attention_mask=mask, **{self.cache_arg: cache})
        self.lengths = [cache.get_seq_length(i) for i in range(LAYERS)]
        self.cache = weakref.ref(cache)
        return out


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                                   num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                                   max_position_embeddings=64)
    model = _Prefixed(transformers.LlamaForCausalLM(cfg)).train()
    ids = torch.randint(0, 64, (2, SEQ))
    return model, {"input_ids": ids, "labels": ids}


def _step(model, kwargs):
    model.zero_grad(set_to_none=True)
    model(**kwargs).loss.backward()
    return [p.grad.clone() for p in model.parameters()], model.lengths


def _plan(*modules: str) -> Plan:
    return Plan(regions=tuple((i, i) for i in range(len(modules))), modules=modules, stochastic=(False,) * len(modules))


@pytest.mark.parametrize("modules", [("lm.model.layers.0", "lm.model.layers.1"),
                                     ("lm.model.layers.0.self_attn", "lm.model.layers.1")],
                         ids=["layers", "attention-and-layer"])
def test_a_filled_cache_is_kept_and_the_recompute_sees_it_as_the_forward_did(modules):
    model, kwargs = _model()
    reference, lengths = _step(model, kwargs)
    assert lengths == [PREFIX + SEQ] * LAYERS
    scheduler.apply(model, _plan(*modules), check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheDropped)  # nothing is dropped
        got, got_lengths = _step(model, kwargs)
    assert [w.recomputes for w in region_wrappers(model)] == [1, 1]
    assert got_lengths == lengths  # the call's keys went in once: the recompute's were taken back out
    assert all(torch.equal(a, b) for a, b in zip(reference, got))


def test_a_traced_and_solved_plan_fits_with_the_prefix():
    model, kwargs = _model()
    reference, _ = _step(model, kwargs)
    graph = scheduler.trace(model, (), kwargs, loss=lambda out: out.loss)
    plan = scheduler.solve(graph, scheduler.simulate(graph).peak_bytes - 1, "ilp", time_limit_s=10)
    assert plan.regions
    scheduler.apply(model, plan)
    got, _ = _step(model, kwargs)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))


def test_a_loop_that_drops_the_output_frees_the_cache_before_the_backward():
    """The regions hold what their recompute needs of the cache (their own layer's prefix), not the cache:
    ``loss = model(**batch).loss`` (Trainer's loop) lets every layer's keys go before ``backward()``, as
    without a plan (holding the cache measured 40,444 B over the prediction on peft's prefix tuning)."""
    model, kwargs = _model()
    reference, _ = _step(model, kwargs)
    scheduler.apply(model, _plan("lm.model.layers.0", "lm.model.layers.1"), check=False)
    model.zero_grad(set_to_none=True)
    loss = model(**kwargs).loss
    gc.collect()
    assert model.cache() is None
    loss.backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(reference, model.parameters()))


def test_a_replay_holds_the_written_objects_as_they_were_and_nothing_else_of_the_cache():
    cache = transformers.DynamicCache()
    k0, k1 = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4)
    cache.update(k0, k0, 0)
    cache.update(k1, k1, 1)
    before = CacheState([cache])
    cache.update(torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4), 1)  # the call writes layer 1
    replay = CacheReplay(cache, before, CacheState([cache]))
    built = replay.build()
    assert type(built) is type(cache) and built is not cache and len(built.layers) == 2
    assert torch.equal(built.layers[1].keys, k1) and built.get_seq_length(1) == 3  # before the call
    assert built.layers[0].keys is cache.layers[0].keys  # layer 0's tensors: held weakly, alive here
    built.update(torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4), 1)  # a recompute writes the copy
    assert cache.get_seq_length(1) == 8 and replay.build().get_seq_length(1) == 3


def test_a_replay_holds_what_the_call_did_not_write_weakly():
    cache = transformers.DynamicCache()
    cache.update(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), 0)
    cache.update(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), 1)
    before = CacheState([cache])
    cache.update(torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4), 1)
    replay = CacheReplay(cache, before, CacheState([cache]))
    del before
    keys = weakref.ref(cache.layers[0].keys)
    del cache
    gc.collect()
    assert keys() is None  # let go of: a stand-in of its shape on meta
    stand_in = replay.build().layers[0].keys
    assert stand_in.device.type == "meta" and stand_in.shape == (1, 1, 2, 4)


@pytest.mark.parametrize("loop", ["held", "dropped"])
def test_t5s_cross_attention_as_a_region_reads_its_layers_self_attention_cache(loop):
    """A stock T5 (``use_cache`` on): the decoder's cross-attention is called after its layer's self-attention
    wrote the cache, so the cache is filled for it and kept; its recompute reads the self-attention keys' length,
    which the replay holds weakly (they were None there once: "'NoneType' object has no attribute 'numel'"), and
    in the dropped loop only by the shape (autograd saved them under another tensor object)."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, decoder_start_token_id=0)).train()
    assert model.config.use_cache
    kwargs = {"input_ids": torch.randint(0, 64, (2, 12)), "labels": torch.randint(0, 64, (2, 6))}

    def grads():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        if loop == "held":
            out = model(**kwargs)
            out.loss.backward()
        else:
            loss = model(**kwargs).loss
            loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    reference = grads()
    scheduler.apply(model, _plan("decoder.block.0.layer.1", "decoder.block.1.layer.1"), check=False)
    got = grads()
    assert [w.recomputes for w in region_wrappers(model)] == [1, 1]
    assert len(got) == len(reference) and all(torch.equal(a, b) for a, b in zip(reference, got))


@pytest.mark.parametrize("path,expected", [
    ("model.layers.slice(None, 2, None).0.mlp", "model.layers.0.mlp"),
    ("layers.slice(1, None, None).0", "layers.1"),
    ("layers.slice(None, None, 3).1", "layers.3"),
    ("a.slice(2, 8, None).slice(1, None, 2).1.x", "a.5.x"),
    ("layers.slice(-2, None, None).0", "layers.slice(-2, None, None).0"),  # needs the length: left
    ("layers.3", "layers.3"),
])
def test_export_paths_through_a_sliced_module_list_name_the_module(path, expected):
    assert _unsliced(path) == expected
