"""An applied plan is seen by gradient-checkpointing checks, and a cache it drops is said
(NOTE [ Visible to gradient-checkpointing checks ] in ``scheduler.applying.visible``, NOTE [ Caches under
recompute ] in ``scheduler.applying.modules``).

On a transformers Llama built with its defaults (``use_cache=True``): in training, the model makes a
key/value cache and hands it to every decoder layer; a layer that is a region drops it, and used to do so
without a word (peft's prefix tuning then failed deep in attention).
"""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch

import scheduler
from scheduler.applying import region_wrappers
from scheduler.applying.regions import CacheDropped
from solvers import Plan

transformers = pytest.importorskip("transformers")



def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, 64, (2, 16))
    return model, {"input_ids": ids, "labels": ids}


def _plan(*modules: str) -> Plan:
    return Plan(regions=tuple((i, i) for i in range(len(modules))), modules=modules, stochastic=(False,) * len(modules))


def _peft_sees_it(model) -> bool:
    # how peft decides that prefix tuning cannot run (and transformers' is_activation_checkpointing)
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def _grads(model, kwargs):
    model.zero_grad(set_to_none=True)
    model(**kwargs).loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_an_applied_plan_is_visible_and_remove_puts_everything_back():
    model, kwargs = _llama()
    keys = list(model.state_dict())
    own = {name: dict(m.__dict__) for name, m in model.named_modules()}
    assert not _peft_sees_it(model)
    scheduler.apply(model, _plan("model.layers.0", "model.layers.1.mlp"), check=False)
    assert _peft_sees_it(model) and model.is_activation_checkpointing
    assert list(model.state_dict()) == keys
    copy = pickle.loads(pickle.dumps(model))
    assert copy.is_activation_checkpointing and len(region_wrappers(copy)) == 2
    scheduler.remove(model)
    assert not _peft_sees_it(model) and not model.is_activation_checkpointing
    assert {name: dict(m.__dict__) for name, m in model.named_modules()} == own


def test_a_dropped_cache_warns_and_the_step_is_the_one_without_the_cache():
    model, kwargs = _llama()
    assert model.config.use_cache
    reference = _grads(model, {**kwargs, "use_cache": False})
    scheduler.apply(model, _plan("model.layers.0", "model.layers.1.mlp"), check=False)
    with pytest.warns(CacheDropped, match=r"LlamaDecoderLayer \(model.layers.0\).*cache=None, use_cache=False"):
        got = _grads(model, kwargs)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    # the layer's own checkpointing (transformers' wrapper reads the flag) did not run as well: one recompute each
    assert [w.recomputes for w in region_wrappers(model)] == [1, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():  # evaluation and generation: nothing is checkpointed, the cache is kept
            assert model(**kwargs).past_key_values is not None
        _grads(model, {**kwargs, "use_cache": False})  # nothing to drop: no warning
