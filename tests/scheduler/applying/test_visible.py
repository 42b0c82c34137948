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


class _CallCheckpointingLayer(torch.nn.Module):
    """A layer as transformers 4.5x-5.1x's ``GradientCheckpointingLayer`` is: its ``__call__`` reads the flag and,
    when it is on in training, calls the layer through ``self._gradient_checkpointing_func``, which only the
    library's ``gradient_checkpointing_enable()`` sets."""

    gradient_checkpointing = False

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(super().__call__, *args, **kwargs)
        return super().__call__(*args, **kwargs)

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.fc(x))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_CallCheckpointingLayer() for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.square().sum()


@pytest.mark.parametrize("theirs_before", [False, True], ids=["never-enabled", "enabled-then-disabled"])
def test_a_layer_that_checkpoints_in_its_call_runs_once_in_the_region(theirs_before):
    torch.manual_seed(0)
    net = _Net().train()
    x = torch.randn(4, 8, requires_grad=True)
    net(x).backward()
    reference = [p.grad.clone() for p in net.parameters()]
    if theirs_before:  # what transformers' enable and disable leave: the function set, the flag off
        for layer in net.layers:
            layer._gradient_checkpointing_func = lambda fn, *a, **k: torch.utils.checkpoint.checkpoint(
                fn, *a, use_reentrant=False, **k)
            layer.gradient_checkpointing = False
    own = [dict(m.__dict__) for m in net.layers]
    scheduler.apply(net, _plan("layers.0", "layers.1"), check=False)
    assert all(layer.gradient_checkpointing for layer in net.layers)
    net.zero_grad(set_to_none=True)
    for layer in net.layers:
        layer.calls = 0
    net(x).backward()  # failed before with "no attribute '_gradient_checkpointing_func'"
    # one forward and one recompute per layer: the layer's own function did not checkpoint inside the region
    assert [layer.calls for layer in net.layers] == [2, 2]
    assert [w.recomputes for w in region_wrappers(net)] == [1, 1]
    assert all(torch.equal(a, p.grad) for a, p in zip(reference, net.parameters()))
    scheduler.remove(net)
    for layer, before in zip(net.layers, own):
        before["calls"] = layer.calls
        assert dict(layer.__dict__) == before
