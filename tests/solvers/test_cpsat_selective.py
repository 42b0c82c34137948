"""Kept nodes in the CP-SAT model (NOTE [ Kept nodes in the CP-SAT model ] in ``solvers.cpsat.kept``).

``cp-sat`` with ``selective=True`` equals the brute force over ``(region, menu
entry)`` pairs on 62 of the small random graphs of ``test_selective_exact``
(every Pareto budget and one byte above; warm start off, so that the model
and its cutting loop, not an incumbent, find the optimum), every plan's
simulated peak fits; ``ilp`` on graphs the frontier program cannot take is
exact too, and keeps the plain fallback only past the model's size limit.
"""

from __future__ import annotations

import pytest

import solvers
from solvers import InfeasibleBudget, Plan, simulate
from solvers import ilp as ilp_mod
from solvers.cpsat import kept as ilp_kept
from solvers.brute_force import best_from_frontier
from solvers.frontier.program import MAX_WIDTH, TooWide
from frontiers import pareto_frontier  # each case's front once per session (shared with test_selective_exact)
from test_selective_exact import CASES, _star

#: The graphs checked against the brute force at every budget (the file's time is about linear in them).
EXACT = CASES[:62]


@pytest.mark.parametrize("name,graph", EXACT, ids=[name for name, _ in EXACT])
def test_cp_sat_with_kept_nodes_equals_brute_force(name, graph):
    front = pareto_frontier(graph)
    for peak, _, _ in front:
        for budget in (peak, peak + 1):
            plan = solvers.solve(graph, budget, solver="cp-sat", selective=True, warm_start=False, time_limit_s=60)
            want = best_from_frontier(front, budget)[1]
            sim = simulate(graph, Plan(regions=plan.regions, saved=plan.saved), record=False)
            assert plan.status == "optimal" and sim.peak_bytes <= budget and sim.recompute_cost == want, (budget, plan)
            assert plan.recompute_cost == want and plan.options["selective"] is True


def test_the_model_keeps_nodes_and_every_plan_fits_or_is_cut():
    kept = 0
    for _, graph in EXACT[:25]:
        for peak, _, _ in pareto_frontier(graph):
            plan = solvers.solve(graph, peak, solver="cp-sat", selective=True, warm_start=False, time_limit_s=60)
            kept += bool(plan.saved)
            assert simulate(graph, plan, record=False).peak_bytes <= peak
    assert kept >= 10


@pytest.mark.parametrize("name,graph", EXACT[::6], ids=[name for name, _ in EXACT[::6]])
def test_cp_sat_with_kept_nodes_and_warm_start(name, graph):
    front = pareto_frontier(graph)
    for budget in (front[0][0], front[len(front) // 2][0], front[-1][0]):
        plan = solvers.solve(graph, budget, solver="cp-sat", selective=True, time_limit_s=60)
        assert plan.status == "optimal" and plan.peak_bytes <= budget
        assert plan.recompute_cost == best_from_frontier(front, budget)[1]
    with pytest.raises(InfeasibleBudget):
        solvers.solve(graph, front[0][0] - 1, solver="cp-sat", selective=True, time_limit_s=60)


def test_ilp_is_exact_with_kept_nodes_where_the_program_cannot_run(monkeypatch):
    def too_wide(graph, **_):
        raise TooWide(99, MAX_WIDTH, 0)

    monkeypatch.setattr(ilp_mod, "frontier_program", too_wide)
    for _, graph in EXACT[::5]:
        front = pareto_frontier(graph)
        for peak, cost, _ in front:
            plan = solvers.solve(graph, peak, solver="ilp", selective=True, time_limit_s=60)
            assert plan.status == "optimal" and plan.peak_bytes <= peak and plan.recompute_cost == cost
            assert "selective" not in plan.findings


def test_ilp_on_a_star_too_wide_for_the_program_keeps_nodes_and_proves_it():
    graph = _star(14)
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(graph, 0, solver="cp-sat", time_limit_s=30)
    budget = info.value.min_feasible_bytes
    plain = solvers.solve(graph, budget, solver="cp-sat", time_limit_s=30)
    plan = solvers.solve(graph, budget, solver="ilp", selective=True, time_limit_s=30)
    assert plan.status == "optimal" and plan.peak_bytes <= budget and plan.recompute_cost <= plain.recompute_cost
    assert "selective" not in plan.findings


def test_past_the_size_limit_the_plan_keeps_none_and_says_so(monkeypatch):
    monkeypatch.setattr(ilp_kept, "MAX_CHOICES", 0)
    graph = next(g for _, g in CASES if len(pareto_frontier(g)) > 2)
    assert ilp_kept.menu_choices(graph) is None
    plan = solvers.solve(graph, pareto_frontier(graph)[0][0], solver="cp-sat", selective=True)
    assert plan.status == "feasible" and plan.bound is None and "not searched" in plan.findings["selective"]
