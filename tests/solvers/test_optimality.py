"""Optimality against brute force on 240 random seeded graphs of 4 to 10 nodes.

``dp`` equals the optimum on chains, ``ilp`` (both its methods: the CP-SAT
model and the frontier program) on every graph, ``chen`` is never below it;
recompute FLOPs compared exactly (integers), and the least feasible budget an
infeasible answer carries equals brute force's least peak.
"""

from __future__ import annotations

import random

import pytest

import solvers
from graphs import synthetic
from solvers import InfeasibleBudget, simulate
from solvers.brute_force import best_from_frontier
from solvers.dp.chain import DPTable
from solvers.frontier.program import FrontierDP
from solvers.ilp import IlpSolver
from frontiers import pareto_frontier  # each case's front once per session
from random_graphs import random_graph


def _cases():
    out = []
    for seed in range(100):
        out.append(("chain", seed, random_graph(seed, chain=True)))
    for seed in range(100, 200):
        out.append(("dag", seed, random_graph(seed, chain=False)))
    # The synthetic families small enough for brute force (a transformer block alone is 12 nodes).
    for fam in ("chain", "hetero-chain", "residual", "unet", "random-dag"):
        for seed in range(8):
            n = 4 + seed if fam != "unet" else 8 + (seed % 3)
            out.append((fam, seed, synthetic.make(fam, min(n, 10), seed=seed)))
    return out


CASES = _cases()


def test_enough_cases():
    assert len(CASES) >= 200
    assert all(4 <= len(g) <= 10 for _, _, g in CASES)


@pytest.mark.parametrize("kind,seed,graph", CASES, ids=[f"{k}-{s}-{len(g)}n" for k, s, g in CASES])
def test_against_brute_force(kind, seed, graph):
    frontier = pareto_frontier(graph)
    least = frontier[0][0]
    is_chain = all(p == ((i - 1,) if i else ()) for i, p in enumerate(graph.preds))
    # Budgets across the feasible range: every frontier point for dp/chen, three for ilp.
    budgets = [peak for peak, _, _ in frontier] + [(frontier[0][0] + frontier[-1][0]) // 2]
    table = DPTable(graph, max_front=None)
    for budget in budgets:
        best = best_from_frontier(frontier, budget)
        assert best is not None
        opt = best[1]
        if is_chain:
            assert table.exact and table.is_chain
            regions, peak, cost = table.solve(budget)
            sim = simulate(graph, solvers.Plan(regions=regions))
            assert (sim.peak_bytes, sim.recompute_flops) == (peak, cost)  # the DP's own prediction is exact
            assert cost == opt and peak <= budget
        try:
            plan = solvers.solve(graph, budget, solver="chen")
            assert plan.recompute_flops >= opt
        except InfeasibleBudget as exc:
            assert exc.min_feasible_bytes > budget
    rng = random.Random(seed)
    for budget in (least, budgets[-1], rng.choice(budgets)):
        opt = best_from_frontier(frontier, budget)[1]
        plan = IlpSolver(graph, budget, time_limit_s=30, workers=1).solve()
        sim = simulate(graph, plan)
        assert sim.peak_bytes <= budget
        assert sim.recompute_flops == opt
        assert plan.status == "optimal"
    # Below the least peak: infeasible, carrying exactly the least peak.
    with pytest.raises(InfeasibleBudget) as info:
        IlpSolver(graph, least - 1, time_limit_s=30, workers=1).solve()
    assert info.value.min_feasible_bytes == least
    assert simulate(graph, solvers.Plan(regions=info.value.best_regions)).peak_bytes == least
    # The frontier program (ilp's method on narrow graphs): the optimum at every
    # budget, nothing below the least peak, and the least peak itself.
    program = FrontierDP(graph, max_width=64)
    for budget in budgets:
        res = program.solve(budget)
        sim = simulate(graph, solvers.Plan(regions=res.regions))
        assert sim.peak_bytes <= budget and sim.recompute_flops == res.objective == best_from_frontier(frontier, budget)[1]
    assert program.solve(least - 1) is None
    res = program.solve(None, objective="peak")
    assert res.objective == least == simulate(graph, solvers.Plan(regions=res.regions)).peak_bytes
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(graph, least - 1, solver="ilp", method="frontier", warm_start=False)
    assert info.value.min_feasible_bytes == least
    if is_chain:
        assert table.min_peak_bytes == least
        with pytest.raises(InfeasibleBudget) as info:
            solvers.solve(graph, least - 1, solver="dp", max_front=None)
        assert info.value.min_feasible_bytes == least


def test_dp_exact_on_dags_without_common_tensors():
    """Off chains the DP cuts wherever one tensor crosses (not only right after
    its producer); without common tensors its every prediction is simulate's."""
    checked, moved = 0, 0
    graphs = [random_graph(seed, chain=False) for seed in range(100, 300)]
    graphs += [synthetic.make(fam, n, seed=s) for fam in ("residual", "unet", "random-dag")
               for n in (12, 30) for s in range(3)]
    for graph in graphs:
        table = DPTable(graph, max_front=None)
        st = table.stages
        moved += any(st.boundary[i] != st.starts[i] - 1 for i in range(1, len(st)))
        if not table.exact:
            continue
        for peak, cost in table.frontier():
            regions, pk, cs = table.solve(peak)
            sim = simulate(graph, solvers.Plan(regions=regions))
            assert (sim.peak_bytes, sim.recompute_flops) == (pk, cs) == (peak, cost)
            checked += 1
    assert checked > 300 and moved > 10  # the generalised cuts were exercised


def test_dp_cuts_before_block_zero_of_a_transformer():
    """The attention mask sits between the embedding and block 0: the cut before
    block 0 is still valid, so dp reaches (and beats) per-module's peak."""
    g = synthetic.make("transformer", 40, seed=0)
    blocks = solvers.baselines.block_regions(g)
    assert blocks[0][0] in stages_of(g).starts
    budget = solvers.solve(g, 10**15, solver="per-module").peak_bytes
    assert solvers.solve(g, budget, solver="dp").recompute_flops <= solvers.solve(g, budget, solver="per-module").recompute_flops


def stages_of(graph):
    return solvers.stages(graph)


@pytest.mark.parametrize("name", solvers.exact_solvers())
def test_registered_exact_solvers_against_brute_force(name):
    """Every registered exact solver (``ilp`` and its methods on their own, ``frontier`` and
    ``cp-sat``) by name through ``solvers.solve``: the optimum at a spread of budgets, and
    below the least peak an infeasible budget carrying exactly the least peak."""
    checked = 0
    for kind, seed, graph in CASES[::6]:  # test_against_brute_force holds each method on every case
        frontier = pareto_frontier(graph)
        least = frontier[0][0]
        for budget in (least, (least + frontier[-1][0]) // 2, frontier[-1][0]):
            plan = solvers.solve(graph, budget, solver=name, time_limit_s=30)
            assert plan.status == "optimal" and plan.peak_bytes <= budget, (kind, seed, budget)
            assert plan.recompute_flops == best_from_frontier(frontier, budget)[1], (kind, seed, budget)
            checked += 1
        with pytest.raises(InfeasibleBudget) as info:
            solvers.solve(graph, least - 1, solver=name, time_limit_s=30)
        assert info.value.proven and info.value.min_feasible_bytes == least, (kind, seed)
    assert checked >= 120
