"""``capture(costs="time")``: measured forward times as the recompute cost (NOTE [ Time costs ])."""

import dataclasses

import pytest
import torch

import solvers
from graphs import HOLDS_OP, synthetic
from scheduler.models import build
from scheduler.tracing.tracer import TraceError, capture
from solvers import activation_budget_bytes
from solvers.dp.chain import DPTable

GPT = dict(layers=2, width=128, heads=4, vocab=512, batch=4, seq=64)


@pytest.fixture(scope="module")
def gpt_pair():
    torch.manual_seed(0)
    ex = build("gpt", **GPT)
    ex.model.train()
    flops = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op", costs="flops")
    rng = torch.get_rng_state()
    timed = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op", costs="time", time_repeats=3)
    assert torch.equal(rng, torch.get_rng_state())  # measuring leaves the user's RNG where it was
    return ex, flops.graph, timed.graph


def test_time_graph_is_the_same_graph_with_other_costs(gpt_pair):
    _, fg, tg = gpt_pair
    assert tg.fingerprint() == fg.fingerprint()  # a plan from one applies to the other
    assert tg.content_hash() != fg.content_hash()
    strip = lambda nd: dataclasses.replace(nd, fwd_cost=0)  # noqa: E731
    assert [strip(a) for a in fg.nodes] == [strip(b) for b in tg.nodes]  # FLOPs included: counted, not replaced
    meta = tg.meta["costs"]
    assert meta["model"] == "time" and meta["forward_ns"] > 0
    assert meta["flops_per_s"] == pytest.approx(1e9 * meta["flops_per_ns"])
    # FLOP-equivalents: the totals agree up to rounding.
    assert abs(sum(tg.recompute_costs()) - fg.total_fwd_flops()) <= len(tg)
    assert all(nd.fwd_cost >= 1 for nd in tg.nodes if nd.op != HOLDS_OP)  # a hold runs nothing: 0
    assert fg.recompute_costs() == [nd.fwd_flops for nd in fg.nodes]


def test_dropout_costs_far_more_time_than_its_flops_say(gpt_pair):
    _, fg, tg = gpt_pair

    def share(g, word):
        costs = g.recompute_costs()
        return sum(c for c, nd in zip(costs, g.nodes) if word in nd.op) / sum(costs)

    assert share(tg, "dropout") > 5 * share(fg, "dropout")
    assert share(tg, "linear") < share(fg, "linear")


def test_plans_solved_on_time_costs_apply_to_a_flop_trace(gpt_pair):
    _, fg, tg = gpt_pair
    budget = activation_budget_bytes(tg, 0.9)
    plan = solvers.solve(tg, budget, solver="dp")
    plan.check_graph(fg)  # no PlanMismatch
    # dp's table is cached by content, so the two graphs get their own answers.
    other = solvers.solve(fg, budget, solver="dp")
    assert other.recompute_flops == solvers.simulate(fg, other, record=False).recompute_flops
    assert plan.recompute_flops == solvers.simulate(tg, plan, record=False).recompute_flops
    assert plan.recompute_cost == solvers.simulate(tg, plan, record=False).recompute_cost
    # the predicted time is the measured time of the recomputed nodes, at the graph's rate
    assert plan.recompute_time_s == pytest.approx(plan.recompute_cost / tg.meta["costs"]["flops_per_s"])


def test_dp_cache_does_not_mix_graphs_that_differ_only_in_costs():
    g = synthetic.make("chain", 30, seed=0)
    cheap_tail = dataclasses.replace(g, nodes=tuple(
        dataclasses.replace(nd, fwd_cost=1 if i > 15 else 10**9) for i, nd in enumerate(g.nodes)))
    assert cheap_tail.fingerprint() == g.fingerprint()
    budget = activation_budget_bytes(g, 0.6)
    a = solvers.solve(g, budget, solver="dp")
    b = solvers.solve(cheap_tail, budget, solver="dp")
    # Each answer is the optimum of its own costs (a table filled afresh, no cache).
    assert a.recompute_cost == DPTable(g, max_front=None).solve(budget)[2]
    assert b.recompute_cost == DPTable(cheap_tail, max_front=None).solve(budget)[2]
    assert a.regions != b.regions


def test_time_costs_on_the_meta_device_and_unknown_cost_models_are_refused():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8, device="meta")
    with pytest.raises(TraceError, match="meta device"):
        capture(model, (x,), costs="time")
    with pytest.raises(TraceError, match="costs='watts'"):
        capture(model, (x,), costs="watts")
    with pytest.raises(TraceError, match="costs='time' times this machine's cpu.*H100"):
        capture(torch.nn.Linear(8, 1), (torch.randn(4, 8),), costs="time", target="H100")
