"""Kept calls at run time (issue 33, items 1 and 4): stock transformers configurations with the default plan.

* GPT-2 as configured by default (``use_cache`` on): the trace records the
  key/value cache writes (``cat``) and the plan keeps some, while a region
  drops the cache as it trains (NOTE [ Caches under recompute ]). The step
  runs, those calls are recomputed (NOTE [ Kept calls that do not come ]),
  gradients are bitwise the unplanned step's and the allocator's peak is at or
  below the prediction; so also under CPU bf16 autocast after the fp32 trace,
  and on a ``.to(torch.bfloat16)`` copy made after ``apply``.
* Double backward (NOTE [ Double backward through kept calls ]):
  ``backward(retain_graph=True)`` twice and a ``create_graph=True`` gradient
  penalty, on GPT-2 and Llama under plans that keep op outputs, equal the
  unplanned model bitwise.
* Casts (NOTE [ Which op a policy keeps ]): a dtype conversion is never kept,
  and a plan that keeps one (an older plan file) degrades under autocast.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
from torch import nn

import scheduler
from scheduler.applying import KeptOpsDropped, region_wrappers
from scheduler.measuring.steps import allocator_step_peak
from scheduler.measuring.storages import measure_step

transformers = pytest.importorskip("transformers")

_PLANS: dict[str, tuple] = {}


def _model(name: str) -> nn.Module:
    """``gpt2`` / ``llama``, with ``-eager`` attention (torch's CPU attention kernel has no double backward)."""
    torch.manual_seed(0)
    family, _, attention = name.partition("-")
    extra = {"attn_implementation": attention} if attention else {}
    if family == "gpt2":  # the configuration: use_cache on, dropout on
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                                                                     **extra)).train()
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1000, **extra)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).train()


def _batch(batch: int = 2, seq: int = 128) -> dict:
    ids = torch.randint(0, 1000, (batch, seq), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def _loss(out):
    return out.loss


#: (model, budget): the default solver keeps op outputs at these (GPT-2: its cache writes among them). Llama
#: runs eager attention only (one trace fewer).
_BUDGETS = {"gpt2": 0.7, "gpt2-eager": 0.7, "llama-eager": 0.9}


def planned(name: str) -> tuple[nn.Module, object, object]:
    """(a model with the default plan applied, its graph, the plan), and an unplanned twin is ``_model(name)``."""
    if name not in _PLANS:
        model = _model(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = scheduler.trace(model, (), _batch(), loss=_loss)
        plan = scheduler.solve(graph, _BUDGETS[name])
        assert any(plan.save_ops), f"the default plan keeps op outputs on {name}"
        _PLANS[name] = (graph, plan)
    graph, plan = _PLANS[name]
    model = _model(name)
    scheduler.apply(model, plan)
    return model, graph, plan


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _step(model: nn.Module, batch: dict, *, autocast: bool = False) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), _grads(model)


def _equal(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and a[1]
    bad = [n for n in a[1] if not torch.equal(a[1][n], b[1][n])]
    assert not bad, f"gradients differ: {bad[:3]}"


# ------------------------------------------------------------------- item 1: GPT-2 with its cache on
def test_gpt2_with_its_cache_on_trains_under_the_default_plan():
    model, graph, plan = planned("gpt2")
    twin = _model("gpt2")
    assert twin.config.use_cache
    kept = {op for ops in plan.save_ops for op, _ in ops}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            _equal(_step(model, _batch()), _step(twin, _batch()))
    dropped = [w for w in seen if issubclass(w.category, KeptOpsDropped)]
    policies = [w.policy for w in region_wrappers(model) if getattr(w, "policy", None)]
    off = {op for p in policies for op in p.off}
    # the cache writes (cat, and the copies around them) are not made: those overloads are recomputed, said once
    assert "aten.addmm.default" not in off, "the projections' counts do not change: still kept"
    assert ("aten.cat.default" in kept) <= ("aten.cat.default" in off)
    assert bool(off) == bool(dropped) and all("key/value cache" in str(w.message) for w in dropped)
    assert len(dropped) <= len(policies), "once per region"
    assert any(p.saved for p in policies), "the other kept calls are still kept"
    predicted = scheduler.simulate(graph, plan).peak_bytes
    measured = measure_step(model, (), _batch(), loss=_loss).peak_bytes
    allocator = allocator_step_peak(model, model, (), _batch(), _loss)
    print(f"gpt2 with its cache: predicted {predicted}, storages {measured}, allocator {allocator}")
    assert measured <= predicted and allocator <= predicted


@pytest.mark.parametrize("how", ["autocast", "bf16 copy"])
def test_gpt2_in_bf16_after_an_fp32_trace(how):
    model, _, _ = planned("gpt2")
    twin = _model("gpt2")
    if how == "bf16 copy":
        model, twin = copy.deepcopy(model).to(torch.bfloat16), twin.to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _equal(_step(model, _batch(), autocast=how == "autocast"), _step(twin, _batch(), autocast=how == "autocast"))
    assert sum(w.recomputes for w in region_wrappers(model)) > 0


@pytest.mark.parametrize("how", ["autocast", "bf16 copy"])
def test_llama_in_bf16_after_an_fp32_trace(how):
    model, _, _ = planned("llama-eager")
    twin = _model("llama-eager")
    if how == "bf16 copy":
        model, twin = copy.deepcopy(model).to(torch.bfloat16), twin.to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _equal(_step(model, _batch(), autocast=how == "autocast"), _step(twin, _batch(), autocast=how == "autocast"))
    policies = [w.policy for w in region_wrappers(model) if getattr(w, "policy", None)]
    assert policies and all(not p.off and p.saved for p in policies), "casts change no kept overload's count"


# ------------------------------------------------------------------- item 4: double backward
def _fresh_forward(m):
    """``m``'s forward on the batch from seed 0, its gradients cleared (the warnings are item 1's)."""
    m.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return m(**_batch())


@pytest.mark.parametrize("name", ["gpt2", "llama-eager"])
def test_backward_twice_with_retain_graph(name):
    model, _, _ = planned(name)
    twin = _model(name)
    results = []
    for m in (model, twin):
        out = _fresh_forward(m)
        out.loss.backward(retain_graph=True)
        out.loss.backward()
        results.append((out.loss.detach(), _grads(m)))
    _equal(*results)
    assert sum(w.recomputes for w in region_wrappers(model)) >= 2 * len(region_wrappers(model))


@pytest.mark.parametrize("name", ["gpt2-eager", "llama-eager"])
def test_gradient_penalty_with_create_graph(name):
    model, _, _ = planned(name)
    twin = _model(name)
    results = []
    for m in (model, twin):
        out = _fresh_forward(m)
        params = [p for p in m.parameters() if p.requires_grad]
        grads = torch.autograd.grad(out.loss, params, create_graph=True, allow_unused=True)
        penalty = sum((g ** 2).sum() for g in grads if g is not None)
        (out.loss + penalty).backward()
        results.append((penalty.detach(), _grads(m)))
    _equal(*results)


# ------------------------------------------------------------------- casts
class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * pos.float()  # int -> float: one _to_copy in fp32; more under autocast


class _Casts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, pos)
        return self.head(x).square().mean()


def test_a_cast_is_never_kept_and_a_plan_keeping_one_degrades_under_autocast():
    torch.manual_seed(0)
    model = _Casts().train()
    x, pos = torch.randn(256, 64), torch.arange(64).repeat(256, 1)
    graph = scheduler.trace(model, (x, pos))
    casts = [nd for nd in graph.nodes if "aten._to_copy.default" in nd.dispatch]
    assert casts and all(nd.sac_op < 0 or nd.dispatch[nd.sac_op] != "aten._to_copy.default" for nd in casts)
    plan = scheduler.solve(graph, 1 << 40, solver="per-module")
    r = plan.modules.index("blocks.0")
    # an older plan kept the cast: the first _to_copy of an fp32 forward, the fourth under autocast
    keeps = tuple(((("aten._to_copy.default", 0),) if i == r else ()) for i in range(len(plan.regions)))
    calls = tuple(((("aten._to_copy.default", 1),) if i == r else ()) for i in range(len(plan.regions)))
    old = dataclasses.replace(plan, save_ops=keeps, save_op_calls=calls)
    twin = copy.deepcopy(model)
    scheduler.apply(model, old)

    def step(m: nn.Module) -> tuple:
        m.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(x, pos)
        loss.backward()
        return loss.detach(), _grads(m)

    with pytest.warns(KeptOpsDropped, match=r"region 'blocks.0'.*aten._to_copy.default: called more than the 1 time"):
        mine = step(model)
    _equal(mine, step(twin))
    policies = [w.policy for w in region_wrappers(model) if w.policy is not None]
    assert len(policies) == 1 and policies[0].off.keys() == {"aten._to_copy.default"}
