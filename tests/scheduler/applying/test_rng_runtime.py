"""NOTE [ RNG replay decided at run time ] and NOTE [ What a region holds ]: a plan traced without
randomness never changes the gradients of a step that has it, and a region holding other modules
than the traced ones is refused.

Every step here runs with the plan and without it from the same seed; gradients must be bitwise equal.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import scheduler
from scheduler.applying import region_wrappers
from scheduler.applying.rng import RandomRegionWarning, random_modules
from scheduler.tracing.tracer import EvalModeWarning, capture
from solvers import Plan, PlanMismatch


# ------------------------------------------------------------------ models
class NoisyBlock(nn.Module):
    """Dropout called functionally: no module says the block draws random numbers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.p = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.dropout(torch.tanh(self.fc(x)), self.p, self.training)


class DropPath(nn.Module):
    """Stochastic depth as timm writes it (drop whole samples of the residual branch)."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - self.drop_prob)
        return x * keep / (1 - self.drop_prob)


class ResBlock(nn.Module):
    """timm's pattern: ``DropPath`` when the rate is positive, else ``Identity``."""

    def __init__(self, width: int, drop_path: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop_path(self.fc2(torch.relu(self.fc1(x))))


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module], width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


class SeqModel(nn.Module):
    """Blocks in a plain ``nn.Sequential``: plans may checkpoint runs of its children."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(*[NoisyBlock(width) for _ in range(4)])
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).square().mean()


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))


def _grads(model: nn.Module, x: torch.Tensor, seed: int = 5) -> dict[str, torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    model(x).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _span_plan(graph, paths: list[str], **fields) -> Plan:
    spans = {sp.module: (sp.first, sp.last) for sp in graph.spans}
    return Plan.from_regions(graph, [spans[p] for p in paths], **fields)


def _assert_bitwise(g0: dict, g1: dict) -> None:
    assert g0.keys() == g1.keys()
    for name in g0:
        assert torch.equal(g0[name], g1[name]), name


def _set_p(model: nn.Module, p: float) -> None:
    for m in model.modules():
        if isinstance(m, NoisyBlock):
            m.p = p


# ------------------------------------------------------------------ random numbers the trace did not see
def test_functional_dropout_switched_on_after_tracing_is_replayed_by_the_watch():
    torch.manual_seed(0)
    model = Stack([NoisyBlock(16) for _ in range(3)]).train()
    graph = capture(model, (_x(),)).graph
    plan = _span_plan(graph, ["blocks.0", "blocks.1"])
    assert plan.stochastic == (False, False)  # p = 0 draws nothing: the trace saw no randomness
    _set_p(model, 0.3)
    assert random_modules([model]) == []  # no module tells: only the watch can see it
    g0 = _grads(model, _x())
    scheduler.apply(model, plan)
    with pytest.warns(RandomRegionWarning, match="generator advanced") as caught:
        g1 = _grads(model, _x())
    assert {str(w.message).split("'")[1] for w in caught} == {"blocks.0", "blocks.1"}
    _assert_bitwise(g0, g1)  # the very first step replays from the watch's snapshot
    assert all(w.stochastic for w in region_wrappers(model))  # later steps replay by checkpoint itself
    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomRegionWarning)  # said once per region
        g2 = _grads(model, _x())
    _assert_bitwise(g0, g2)


def test_regions_that_draw_nothing_are_not_switched():
    torch.manual_seed(0)
    model = Stack([NoisyBlock(16) for _ in range(3)]).train()
    graph = capture(model, (_x(),)).graph
    scheduler.apply(model, _span_plan(graph, ["blocks.0", "blocks.2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomRegionWarning)
        _grads(model, _x(), seed=7)
    wrappers = region_wrappers(model)
    assert len(wrappers) == 2 and not any(w.stochastic for w in wrappers)
    assert sum(w.recomputes for w in wrappers) == 2


def test_the_watch_leaves_the_generator_where_the_plain_step_leaves_it():
    torch.manual_seed(0)
    model = Stack([NoisyBlock(16) for _ in range(2)]).train()
    graph = capture(model, (_x(),)).graph
    _set_p(model, 0.5)
    _grads(model, _x(), seed=11)
    after_plain = torch.get_rng_state()
    scheduler.apply(model, _span_plan(graph, ["blocks.0", "blocks.1"]))
    with pytest.warns(RandomRegionWarning):
        _grads(model, _x(), seed=11)
    assert torch.equal(torch.get_rng_state(), after_plain)


def test_runs_of_a_sequential_are_watched_too():
    torch.manual_seed(0)
    model = SeqModel().train()
    graph = capture(model, (_x(),)).graph
    runs = [sp.module for sp in graph.spans if sp.module.startswith("body[")]
    assert "body[0:2]" in runs, runs  # children 0 and 1
    plan = _span_plan(graph, ["body[0:2]", "body.3"])
    _set_p(model, 0.25)
    g0 = _grads(model, _x())
    scheduler.apply(model, plan)
    with pytest.warns(RandomRegionWarning):
        g1 = _grads(model, _x())
    _assert_bitwise(g0, g1)
    g2 = _grads(model, _x())
    _assert_bitwise(g0, g2)


def test_a_selective_region_is_watched_without_disturbing_its_policy():
    torch.manual_seed(0)
    model = Stack([NoisyBlock(16) for _ in range(2)]).train()
    graph = capture(model, (_x(),), granularity="op").graph
    a, b = next((sp.first, sp.last) for sp in graph.spans if sp.module == "blocks.0")
    keep = next(k for k in range(a, b + 1) if graph.nodes[k].sac_op >= 0 and "aten.addmm.default" in graph.nodes[k].dispatch)
    plan = Plan.from_regions(graph, [(a, b)], saved=(keep,))
    assert plan.save_ops
    _set_p(model, 0.4)
    g0 = _grads(model, _x())
    scheduler.apply(model, plan)
    with pytest.warns(RandomRegionWarning):
        g1 = _grads(model, _x())
    _assert_bitwise(g0, g1)


def test_dropout_modules_in_training_mode_replay_even_when_the_plan_says_otherwise():
    torch.manual_seed(0)
    model = Stack([nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.3), nn.Tanh()) for _ in range(2)]).train()
    graph = capture(model, (_x(),)).graph
    plan = _span_plan(graph, ["blocks.0", "blocks.1"])
    assert all(plan.stochastic)
    edited = dataclasses.replace(plan, stochastic=(False, False))  # flags edited in the JSON
    g0 = _grads(model, _x())
    scheduler.apply(model, edited)
    with pytest.warns(RandomRegionWarning, match="Dropout called in training mode"):
        g1 = _grads(model, _x())
    _assert_bitwise(g0, g1)


# ------------------------------------------------------------------ eval-mode traces
def _tiny_gpt2_eval():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()  # as from_pretrained returns it
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
    return model, {"input_ids": ids, "labels": ids}


def _hf_grads(model: nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(9)
    model(**batch).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_a_model_in_eval_mode_is_traced_as_it_trains_and_left_as_it_was():
    model, batch = _tiny_gpt2_eval()
    with pytest.warns(EvalModeWarning, match="traced as it trains"):
        graph = capture(model, (), batch, loss=lambda out: out.loss).graph
    assert not any(m.training for m in model.modules())  # modes put back
    assert graph.meta["training"] is True
    plan = _span_plan(graph, ["transformer.h.0", "transformer.h.1"])
    assert plan.stochastic == (True, True)  # dropout's masks and RNG state are in the graph
    model.train()
    g0 = _hf_grads(model, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: the plan is of this training step
        scheduler.apply(model, plan)
        g1 = _hf_grads(model, batch)
    _assert_bitwise(g0, g1)


def test_a_trace_in_eval_mode_as_is_still_trains_with_exact_gradients():
    model, batch = _tiny_gpt2_eval()
    with pytest.warns(EvalModeWarning, match="evaluation step"):
        graph = capture(model, (), batch, loss=lambda out: out.loss, mode="as-is").graph
    plan = _span_plan(graph, ["transformer.h.0", "transformer.h.1"])
    assert plan.stochastic == (False, False)
    model.train()
    g0 = _hf_grads(model, batch)
    with pytest.warns(EvalModeWarning, match="eval mode"):
        scheduler.apply(model, plan)
    with pytest.warns(RandomRegionWarning):
        g1 = _hf_grads(model, batch)
    _assert_bitwise(g0, g1)


def test_tracing_a_model_in_eval_mode_leaves_its_batchnorm_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 1)).eval()
    stats = [b.clone() for b in model.buffers()]
    with pytest.warns(EvalModeWarning):
        graph = capture(model, (torch.randn(2, 3, 8, 8),), loss=lambda out: out.sum()).graph
    assert any(nd.stateful for nd in graph.nodes)  # BatchNorm traced as it trains: it updates its statistics
    assert all(torch.equal(a, b) for a, b in zip(stats, model.buffers()))


# ------------------------------------------------------------------ what a region holds
def test_a_plan_traced_without_stochastic_depth_is_refused_on_the_model_with_it():
    torch.manual_seed(0)
    traced = Stack([ResBlock(16, 0.0) for _ in range(2)]).train()
    graph = capture(traced, (_x(),)).graph
    plan = _span_plan(graph, ["blocks.0"])
    with_depth = Stack([ResBlock(16, 0.1) for _ in range(2)]).train()
    assert sum(p.numel() for p in with_depth.parameters()) == sum(p.numel() for p in traced.parameters())
    with pytest.raises(PlanMismatch, match=r"'blocks\.0\.drop_path' inside region 'blocks\.0' was a Identity and is a DropPath"):
        scheduler.apply(with_depth, plan)
    scheduler.apply(with_depth, plan, check=False)  # the user's override; gradients still exact
    g1 = _grads(with_depth, _x())
    scheduler.remove(with_depth)
    _assert_bitwise(_grads(with_depth, _x()), g1)


def test_a_module_added_inside_a_region_is_named():
    torch.manual_seed(0)
    model = Stack([ResBlock(16, 0.0) for _ in range(2)]).train()
    graph = capture(model, (_x(),)).graph
    plan = _span_plan(graph, ["blocks.1"])
    model.blocks[1].extra = nn.ReLU()  # e.g. an adapter switched on since tracing (no parameters)
    with pytest.raises(PlanMismatch, match=r"holds 'blocks\.1\.extra' \(a ReLU\)"):
        scheduler.apply(model, plan)
    del model.blocks[1].extra
    del model.blocks[1].drop_path
    with pytest.raises(PlanMismatch, match=r"held 'blocks\.1\.drop_path'"):
        scheduler.apply(model, plan)


def test_a_model_with_some_modules_in_eval_mode_is_traced_as_it_trains():
    # get_peft_model around a from_pretrained base: the wrapper trains, the base's dropouts rest. Traced in those
    # modes, the base's dropout masks were not planned and, after model.train(), a LoRA GPT-2's plan measured
    # 105,216 B over its budget (benchmarks/thirdparty.py).
    model, batch = _tiny_gpt2_eval()
    model.training = True  # the root alone, as the peft wrapper
    with pytest.warns(EvalModeWarning, match="modules are not .*traced as it trains"):
        graph = capture(model, (), batch, loss=lambda out: out.loss).graph
    assert model.training and not any(m.training for m in model.transformer.modules())  # modes put back
    assert graph.meta["training"] is True
    assert _span_plan(graph, ["transformer.h.0", "transformer.h.1"]).stochastic == (True, True)
