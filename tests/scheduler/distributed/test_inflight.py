"""A stage's plan with several micro-batches in flight is exact: it equals brute force over every interval plan."""

from __future__ import annotations

import dataclasses

import pytest

from random_graphs import random_graph
from solvers import InfeasibleBudget, Plan, simulate
from solvers.brute_force import enumerate_plans
from solvers.model.meter import FORWARD
from scheduler.distributed.inflight import ballast_graph, chunk_memory, persistent_graph, solve_inflight, stage_value

SEEDS = range(24)
BRUTE_SEEDS = range(16)  # the brute-force comparison: seconds each


def _exhaustive(graph, k):
    """(stage value, recompute cost) of every interval plan: NOTE [ Solving with micro-batches in flight ]."""
    out = []
    for regions in enumerate_plans(graph):
        plan = Plan(regions=regions)
        value = graph.param_bytes + graph.input_bytes + stage_value(chunk_memory(graph, plan), k)
        out.append((value, simulate(graph, plan, record=False).recompute_cost))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", BRUTE_SEEDS)
def test_inflight_plans_equal_brute_force(seed):
    """Exact wherever the last node's gradient is no view (NOTE [ Solving with micro-batches in flight ])."""
    graph = random_graph(seed, chain=seed % 2 == 0)
    exact = not graph.nodes[-1].grad_views
    for k in (2, 3):
        points = _exhaustive(graph, k)
        values = sorted({v for v, _ in points})
        for budget in values[::max(1, len(values) // 3)] + [values[0] - 1]:
            want = min((c for v, c in points if v <= budget), default=None)
            if want is None:
                with pytest.raises(InfeasibleBudget):
                    solve_inflight(graph, budget, k, tolerance_bytes=0)
                continue
            try:
                got = solve_inflight(graph, budget, k, tolerance_bytes=0)
            except InfeasibleBudget:
                assert not exact, (seed, k, budget)  # conservative where the ballast is: no plan claimed
                continue
            assert got.value_bytes <= budget, "the plan fits"
            assert got.value_bytes == graph.param_bytes + graph.input_bytes + stage_value(got.memory, k)
            if exact:
                assert got.plan.recompute_cost == want and got.status == "optimal", (seed, k, budget)
            else:
                assert got.plan.recompute_cost >= want
            # within a tolerance: fits, and costs no more than the best plan fitting the budget less the tolerance
            tolerance = budget // 8
            within = min((c for v, c in points if v <= budget - tolerance), default=None)
            if exact and within is not None:
                loose = solve_inflight(graph, budget, k, tolerance_bytes=tolerance)
                assert loose.value_bytes <= budget and loose.plan.recompute_cost <= within, (seed, k, budget)
            first = solve_inflight(graph, budget, k, first_fit=True)  # a feasibility check: fits, claims no optimum
            assert first.value_bytes <= budget and first.status == "feasible"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_ballast_changes_no_step_but_its_own(seed):
    """NOTE [ Solving with micro-batches in flight ]: every step of the original graph costs what it did (shifted
    by a constant when the persistent bytes are fewer than the gradient moved); the ballast's forward step sees R."""
    drawn = random_graph(seed, chain=seed % 2 == 1)  # the last node's gradient no view: where the ballast is exact
    graph = persistent_graph(drawn.with_nodes(drawn.nodes[:-1] + (dataclasses.replace(drawn.nodes[-1], grad_views=False),)))
    for regions in list(enumerate_plans(graph))[:40]:
        plan = Plan(regions=regions)
        plain = simulate(graph, plan)
        ballasted, shift = ballast_graph(graph, 0)
        sim = simulate(ballasted, plan)
        z = len(graph.nodes)
        kept = [(s, live - shift) for s, live in zip(sim.steps, sim.live_bytes) if s[1] != z]
        assert kept == list(zip(plain.steps, plain.live_bytes))
        retained = next(live for (phase, node), live in zip(sim.steps, sim.live_bytes) if phase == FORWARD and node == z)
        assert retained - ballasted.param_bytes - ballasted.input_bytes == chunk_memory(graph, plan).retained_bytes
