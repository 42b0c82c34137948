"""The user's loop (NOTE [ The user's loop ] in ``graphs.graph``): the model's output held through ``backward()``
or dropped before, traced, predicted and measured both ways.

``out = model(**batch); out.loss.backward()`` keeps ``out`` alive through the backward; a plan solved for a
loop that drops it measured 12-20 % over its prediction on transformers models. Here every prediction is set
beside a step run in each loop style (``scheduler.measuring.training.training_step``), by live tensor storages;
``benchmarks/loop.py`` does the same on transformers' Llama, GPT-2 and BERT-MLM.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import scheduler
import solvers
from graphs import Graph
from scheduler.measuring.storages import measure_step
from scheduler.measuring.verification import verify
from scheduler.tracing.tracer import EvalModeWarning
from scheduler.tracing.outputs import tensor_leaves


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Returns its loss, logits and last hidden state, as a transformers model called with labels does."""

    def __init__(self, vocab: int = 128, d: int = 64, n: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> dict:
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        logits = self.head(h)
        return {"loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten()), "logits": logits, "hidden": h}


@functools.lru_cache(maxsize=None)
def _tiny():
    """The model, its inputs and its graph for the held loop (traced once for the file)."""
    torch.manual_seed(0)
    model, args = TinyLM().train(), (torch.randint(0, 128, (8, 32)), torch.randint(0, 128, (8, 32)))
    return model, args, scheduler.trace(model, args, loss=_loss)


def _loss(out):
    return out["loss"]


def _measured(model, args, plan, loop):
    if plan.regions:
        scheduler.apply(model, plan)
    try:
        return measure_step(model, args, loss=_loss, loop=loop).peak_bytes
    finally:
        scheduler.remove(model)


def _module_of(graph: Graph, name: str) -> str:
    return graph.nodes[graph.index[name]].module


def test_the_outputs_are_the_tensors_the_model_returns():
    # NOTE [ Finding the model's outputs ]: with loss=, the model's own return value (loss, logits,
    # hidden state), not only the loss; without it, what the graph returns.
    model, args, g = _tiny()
    assert g.loop == "held" and {_module_of(g, name) for name in g.outputs} == {"blocks.3", "head", ""}
    assert sum(g.nodes[k].out_bytes for k in g.held_outputs()) == 4 + 8 * 32 * 128 * 4 + 8 * 32 * 64 * 4
    model.eval()  # traced as it trains (a warning says so), the loop asked for kept
    try:
        with pytest.warns(EvalModeWarning):
            plain = scheduler.trace(model, args, loop="dropped")
    finally:
        model.train()
    assert {_module_of(plain, name) for name in plain.outputs} == {"blocks.3", "head", ""}
    assert plain.loop == "dropped" and plain.held_outputs() == ()


def test_tensor_leaves_look_into_containers_and_cache_objects():
    class Cache:  # like transformers' DynamicCache: tensors in attributes, no pytree node
        def __init__(self, k, v):
            self.layers = [{"keys": k, "values": v}]

    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    got = tensor_leaves({"logits": a, "past": Cache(b, c), "n": 3, "same": a})
    assert [t.shape for t in got] == [a.shape, b.shape, c.shape]


@pytest.mark.parametrize("regions", [(), ("blocks.1",), ("head",), ("blocks.3", "head")])
def test_each_loop_is_predicted_as_measured(regions):
    # The held output (logits) is produced inside the region "head": the caller holds its forward copy and
    # the recompute makes another. Both loops, each plan: the difference the loop makes is predicted to
    # the byte, and every prediction bounds its own loop's step (4 bytes over: the loss's own buffer).
    model, args, g = _tiny()
    spans = {sp.module: (sp.first, sp.last) for sp in g.spans}
    plan = solvers.Plan.from_regions(g, [spans[r] for r in regions])
    pred = {loop: solvers.simulate(g.with_loop(loop), plan).peak_bytes for loop in ("held", "dropped")}
    meas = {loop: _measured(model, args, plan, loop) for loop in ("held", "dropped")}
    for loop in pred:  # to the byte but for the loss's 4-byte buffer in the dropped loop
        assert 0 <= pred[loop] - meas[loop] <= 4, (loop, pred, meas)
    assert abs((pred["held"] - pred["dropped"]) - (meas["held"] - meas["dropped"])) <= 4
    assert meas["held"] - meas["dropped"] >= 8 * 32 * 128 * 4  # the logits, at least


def test_a_plan_for_the_dropped_loop_runs_over_in_the_held_loop_and_the_default_does_not():
    model, args, held = _tiny()
    budget = solvers.activation_budget_bytes(held, 0.6)
    safe = scheduler.solve(held, budget)
    risky = scheduler.solve(held.with_loop("dropped"), budget)
    assert (safe.loop, risky.loop) == ("held", "dropped")
    assert max(_measured(model, args, safe, loop) for loop in ("held", "dropped")) <= budget
    assert _measured(model, args, risky, "held") > budget >= _measured(model, args, risky, "dropped")


def test_verify_runs_the_plans_loop_or_the_one_asked_for():
    model, args, g = _tiny()
    g = g.with_loop("dropped")
    plan = scheduler.solve(g, 0.6)
    kw = dict(loss=_loss, graph=g, steps=1, warmup=0)
    v = verify(model, plan, args, **kw)
    assert v.loop == "dropped" and v.counted_peak_bytes <= v.predicted_peak_bytes and v.max_grad_diff == 0
    held = verify(model, plan, args, loop="held", **kw)
    assert held.loop == "held" and held.predicted_peak_bytes > v.predicted_peak_bytes
    # each loop's count to the byte but for the loss's 4-byte total_weight, which eager frees inside the
    # merged loss node's backward and simulate holds to its end (NOTE [ Saved Python scalars ]): the dropped
    # plan peaks there
    for run in (v, held):
        assert 0 <= run.predicted_peak_bytes - run.counted_peak_bytes <= 4, run
