"""The generator state a stochastic region stores (NOTE [ RNG state per region ] in ``solvers.model.terms``).

``simulate`` counts ``Graph.rng_state_bytes`` for every region holding a
stochastic node, from the region's first forward step to its first node's
backward, twice while it recomputes; the exact solvers model the same bytes,
so their plans are still optimal against the brute force and fit the
simulated peak.
"""

from __future__ import annotations


import pytest

import solvers
from graphs import Graph, Node
from solvers import Plan, pareto_frontier, simulate
from solvers.brute_force import best_from_frontier
from solvers.dp.chain import DPTable
from solvers.frontier.program import FrontierDP
from random_graphs import random_graph, with_randomness

RNG = 5056


def _chain(rng_state_bytes: int = RNG) -> Graph:
    nodes = [
        Node("x", (), out_bytes=1000, fwd_flops=10, saves_output=True),
        Node("lin", ("x",), out_bytes=1000, fwd_flops=100, saves_inputs=("x",)),
        Node("drop", ("lin",), out_bytes=1000, fwd_flops=5, saved_bytes=250, stochastic=True),
        Node("act", ("drop",), out_bytes=1000, fwd_flops=5, saves_output=True),
        Node("out", ("act",), out_bytes=8, fwd_flops=10, saves_inputs=("act",)),
    ]
    return Graph(nodes=tuple(nodes), param_bytes=400, input_bytes=100, rng_state_bytes=rng_state_bytes, name="rng")


def test_simulate_holds_the_state_from_the_forward_to_the_first_nodes_backward():
    with_rng, without = _chain(), _chain(0)
    plan = Plan(regions=((1, 2), (3, 3)))  # only the first region draws random numbers
    a, b = simulate(with_rng, plan), simulate(without, plan)
    assert a.steps == b.steps
    diff = [x - y for x, y in zip(a.live_bytes, b.live_bytes)]
    expected = []
    for phase, i in a.steps:
        if phase == "forward":
            expected.append(RNG if i >= 1 else 0)
        elif phase == "recompute":
            expected.append(2 * RNG if i in (1, 2) else RNG)  # fork_rng's copy while it recomputes
        else:
            expected.append(RNG if i >= 1 else 0)  # released with the region's inputs after node 1's backward
    assert diff == expected
    assert a.peak_bytes > b.peak_bytes
    # A region without a stochastic node stores nothing; store-all stores nothing.
    assert simulate(with_rng, Plan(regions=((3, 3),))).live_bytes == simulate(without, Plan(regions=((3, 3),))).live_bytes
    assert simulate(with_rng).peak_bytes == simulate(without).peak_bytes


def test_graph_field_round_trips_and_old_files_read_as_zero():
    g = _chain()
    d = g.to_dict()
    assert d["rng_state_bytes"] == RNG
    assert Graph.from_dict(d) == g
    del d["rng_state_bytes"]  # a file written before the field
    assert Graph.from_dict(d).rng_state_bytes == 0
    assert "rng_state_bytes" not in _chain(0).to_dict()
    assert g.fingerprint() == _chain(0).fingerprint()  # memory accounting, not what a plan does


def _random(seed: int, chain: bool) -> Graph:
    """A small random graph with stochastic nodes and a generator state to store."""
    return with_randomness(random_graph(seed, chain=chain), seed)


CASES = [(seed, seed % 2 == 0) for seed in range(24)]


@pytest.mark.parametrize("seed,chain", CASES)
def test_exact_solvers_count_the_state_and_stay_optimal(seed, chain):
    g = _random(seed, chain)
    frontier = pareto_frontier(g, selective=False)
    least = frontier[0][0]
    budgets = sorted({least, (least + frontier[-1][0]) // 2, frontier[-1][0]})
    program = FrontierDP(g, max_width=64)
    assert program.solve(None, objective="peak").objective == least
    for budget in budgets:
        opt = best_from_frontier(frontier, budget)[1]
        res = program.solve(budget)
        sim = simulate(g, Plan(regions=res.regions))
        assert sim.peak_bytes <= budget and sim.recompute_flops == res.objective == opt
        for name in ("ilp", "cp-sat"):
            plan = solvers.solve(g, budget, solver=name, time_limit_s=30)
            assert plan.peak_bytes <= budget and plan.recompute_flops == opt, name
        if chain:
            regions, peak, cost = DPTable(g, max_front=None, selective=False).solve(budget)
            sim = simulate(g, Plan(regions=regions))
            assert (sim.peak_bytes, sim.recompute_flops) == (peak, cost) and cost == opt


def test_cp_sat_model_least_peak_counts_the_state():
    pytest.importorskip("ortools")
    from solvers.cpsat.model import CheckpointModel

    for seed in range(6):
        g = _random(seed, chain=seed % 2 == 1)
        least = pareto_frontier(g, selective=False)[0][0]
        res = CheckpointModel(g, budget_bytes=None).solve(time_limit_s=20, workers=1)
        assert round(res.objective) + g.param_bytes + g.input_bytes == least


def test_selective_dp_counts_the_state():
    for seed in range(0, 24, 2):
        g = _random(seed, chain=True)
        frontier = pareto_frontier(g, selective=True)
        table = DPTable(g, max_front=None, selective=True)
        for peak, cost, _ in frontier:
            _, pk, cs = table.solve(peak)
            assert pk <= peak and cs == best_from_frontier(frontier, peak)[1]


def test_a_trace_on_the_cpu_records_the_generators_state():
    torch = pytest.importorskip("torch")
    import scheduler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)).train()
    g = scheduler.trace(model, torch.randn(4, 8), loss=lambda y: y.sum())
    assert g.rng_state_bytes == torch.get_rng_state().numel()
    assert any(nd.stochastic for nd in g.nodes)
