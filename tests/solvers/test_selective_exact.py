"""Exactness over selective recompute: every solver that claims it equals the brute force.

The brute force (``solvers.brute_force``) enumerates every interval plan and,
per region, every entry of its menu of kept sets (NOTE [ The menu of kept
sets ] in ``solvers.model.selective``), costing each with ``simulate``. Against it,
on 200+ small random graphs (chains and DAGs, some with module spans, about
60 % of the nodes keepable) at every Pareto budget and one byte above:

* the frontier program with ``selective`` (NOTE [ Kept nodes in the frontier
  DP ] in ``solvers.frontier.kept``), its least peak, and ``frontier`` /
  ``ilp`` through ``solvers.solve``;
* ``dp`` with ``selective`` on the chains among them (40+);
* each plan's simulated peak within the budget, its cost the program's own
  prediction, and the selective optimum never above the plain one.

``cp-sat`` with kept nodes is checked in ``test_cpsat_selective``; here it
takes ``selective=True`` through both names, and past the CP-SAT model's size
limit ``ilp`` on a graph too wide for the program says its plan was not
searched over kept nodes.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

import solvers
from graphs import Graph, Node, synthetic
from solvers import InfeasibleBudget, Plan, simulate
from solvers.brute_force import best_from_frontier, count_selective, enumerate_plans, enumerate_selective
from solvers.dp.chain import DPTable
from solvers import ilp as ilp_mod
from solvers.cpsat import kept as ilp_kept
from solvers.frontier.program import MAX_WIDTH, FrontierDP, TooWide, width
from solvers.ilp import keepable
from solvers.model.selective import variants
from frontiers import pareto_frontier  # each case's front once per session (test_cpsat_selective shares them)
from random_graphs import random_graph, random_spans, with_randomness

#: Graphs with more (region, menu entry) plans than this are left out, to keep the file under a minute;
#: so are graphs where no node may be kept (nothing to test).
MAX_PLANS = 1200


def sac_graph(seed: int) -> Graph:
    """A random graph of 4 to 9 nodes, a chain for every third seed, module spans for every fourth, and
    about 60 % of its nodes keepable."""
    g = random_graph(seed, chain=seed % 3 == 0)
    if seed % 4 == 1:
        g = dataclasses.replace(g, spans=tuple(random_spans(len(g), random.Random(7000 + seed), laminar=seed % 8 == 1)))
    return synthetic.mark_saveable(g, 0.6, seed=seed)


def _cases(count: int) -> list[tuple[str, Graph]]:
    out = []
    for fam in ("residual", "random-dag", "hetero-chain"):  # the synthetic families small enough
        for seed in range(4):
            g = synthetic.mark_saveable(synthetic.make(fam, 5 + seed % 2, seed=seed), 0.6, seed=seed)
            if keepable(g) and count_selective(g) <= MAX_PLANS:
                out.append((f"{fam}-{seed}", g))
    seed = 0
    while len(out) < count:
        g = sac_graph(seed)
        if keepable(g) and count_selective(g) <= MAX_PLANS:
            out.append((f"{'chain' if seed % 3 == 0 else 'dag'}-{seed}{'-spans' if g.spans else ''}", g))
        seed += 1
    return out


CASES = _cases(210)


def _is_chain(g: Graph) -> bool:
    return all(nd.inputs == ((g.nodes[i - 1].name,) if i else ()) for i, nd in enumerate(g.nodes))


def test_enough_cases():
    assert len(CASES) >= 200
    assert sum(_is_chain(g) for _, g in CASES) >= 40
    assert sum(bool(g.spans) for _, g in CASES) >= 30
    assert all(keepable(g) for _, g in CASES)


@pytest.mark.parametrize("name,graph", CASES, ids=[name for name, _ in CASES])
def test_frontier_and_dp_equal_brute_force(name, graph):
    front = pareto_frontier(graph)
    least = front[0][0]
    program = FrontierDP(graph, max_width=64, selective=True)
    plain = FrontierDP(graph, max_width=64)
    assert program.solve(None, objective="peak").objective == least
    assert program.solve(least - 1) is None
    table = DPTable(graph, max_front=None) if _is_chain(graph) else None
    assert table is None or (table.is_chain and table.exact and table.min_peak_bytes == least)
    for peak, _, _ in front:
        for budget in (peak, peak + 1):
            want = best_from_frontier(front, budget)[1]
            res = program.solve(budget)
            sim = simulate(graph, Plan(regions=res.regions, saved=res.saved), record=False)
            assert sim.peak_bytes <= budget and sim.recompute_cost == res.objective == want, (budget, res)
            without = plain.solve(budget)
            assert without is None or res.objective <= without.objective
            if table is not None:
                answer = table.solve(budget)
                sim = simulate(graph, Plan(regions=answer[0], saved=answer.saved), record=False)
                assert sim.peak_bytes <= budget and sim.recompute_cost == answer[2] == want, budget


@pytest.mark.parametrize("name,graph", CASES[::10], ids=[name for name, _ in CASES[::10]])
@pytest.mark.parametrize("solver", ["frontier", "ilp"])
def test_registered_solvers_with_selective(name, graph, solver):
    front = pareto_frontier(graph)
    for budget in (front[0][0], front[len(front) // 2][0], front[-1][0]):
        plan = solvers.solve(graph, budget, solver=solver, selective=True, time_limit_s=30)
        assert plan.status == "optimal" and plan.peak_bytes <= budget
        assert plan.recompute_cost == best_from_frontier(front, budget)[1]
        assert plan.options["selective"] is True
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(graph, front[0][0] - 1, solver=solver, selective=True, time_limit_s=30)
    assert info.value.min_feasible_bytes == front[0][0]


def test_some_optimum_keeps_nodes_and_beats_every_plan_without():
    kept = better = 0
    for _, graph in CASES[:70]:
        program, plain = FrontierDP(graph, max_width=64, selective=True), FrontierDP(graph, max_width=64)
        least, top = program.solve(None, objective="peak").objective, simulate(graph, record=False).peak_bytes
        for budget in range(least, top + 1, max(1, (top - least) // 6)):
            res, without = program.solve(budget), plain.solve(budget)
            kept += bool(res.saved)
            better += without is None or res.objective < without.objective
    assert kept >= 20 and better >= 10


def test_brute_force_enumerates_regions_times_menu_entries():
    # Every plan is a set of regions and one menu entry per region, each exactly once.
    for _, graph in CASES[:20]:
        got = list(enumerate_selective(graph))
        assert len(got) == len(set(got)) == count_selective(graph)
        want = 0
        for regions in enumerate_plans(graph):
            ways = 1
            for a, b in regions:
                ways *= len(variants(graph, a, b))
            want += ways
        assert want == len(got)
        assert all(all(any(a <= k <= b for a, b in regions) for k in saved) for regions, saved in got)


# ------------------------------------------------------------------ cp-sat
def _star(n: int) -> Graph:
    """A root read by ``n`` branches that one sink reads: ``n`` tensors open before the sink."""
    nodes = [Node("root", out_bytes=100, fwd_flops=5)]
    nodes += [Node(f"b{i}", inputs=("root",), saves_inputs=("root",), saves_output=True, saved_bytes=50,
                   out_bytes=100 + i, fwd_flops=10 + i) for i in range(n)]
    nodes.append(Node("sink", inputs=tuple(f"b{i}" for i in range(n)), out_bytes=4, fwd_flops=1))
    return synthetic.mark_saveable(Graph(nodes=tuple(nodes), name="star"), 1.0)


@pytest.mark.parametrize("how", [dict(solver="cp-sat"), dict(solver="ilp", method="cp-sat")], ids=str)
def test_cp_sat_takes_selective(how):
    graph = next(g for _, g in CASES if len(pareto_frontier(g)) > 2)
    front = pareto_frontier(graph)
    budget = front[len(front) // 2][0]
    plan = solvers.solve(graph, budget, selective=True, time_limit_s=30, **how)
    assert plan.status == "optimal" and plan.peak_bytes <= budget
    assert plan.recompute_cost == best_from_frontier(front, budget)[1]
    plan = solvers.solve(graph, 10**12, selective=False, **how)  # regions only: fine
    assert not plan.saved


def test_ilp_on_a_graph_too_wide_for_the_model_too_says_selective_was_not_searched(monkeypatch):
    monkeypatch.setattr(ilp_kept, "MAX_CHOICES", 0)  # as if the kept-node model were too large
    graph = _star(14)
    assert width(graph) > MAX_WIDTH
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(graph, 0, solver="cp-sat", time_limit_s=30)
    least = info.value.min_feasible_bytes
    budget = least  # tight: no plan recomputes nothing (a plan that costs 0 is optimal over any set)
    plan = solvers.solve(graph, budget, solver="ilp", selective=True, time_limit_s=30)
    assert plan.status == "feasible" and plan.bound is None and not plan.saved
    assert "not searched" in plan.findings["selective"]
    assert plan.peak_bytes <= budget and plan.recompute_cost > 0
    with pytest.raises(InfeasibleBudget, match="keep no node"):  # the least is over those plans only
        solvers.solve(graph, least - 1, solver="ilp", selective=True, time_limit_s=30)


def test_ilp_falls_back_to_dps_kept_plan_where_it_is_cheaper(monkeypatch):
    # Where neither the program nor the kept-node model can run, ilp returns dp's selective plan when it
    # beats CP-SAT's; on a chain dp is exact over regions and kept nodes, so it is proven optimal.
    def too_wide(graph, **_):
        raise TooWide(99, MAX_WIDTH, 0)

    monkeypatch.setattr(ilp_mod, "frontier_program", too_wide)
    monkeypatch.setattr(ilp_kept, "MAX_CHOICES", 0)
    checked = 0
    for _, graph in CASES:
        if not _is_chain(graph):
            continue
        for peak, cost, _ in pareto_frontier(graph):
            try:
                plain = solvers.solve(graph, peak, solver="cp-sat", selective=False, time_limit_s=30).recompute_cost
            except InfeasibleBudget:  # only a plan that keeps nodes fits (a kept held output: one copy, not two)
                plain = None
            if plain is not None and plain <= cost:
                continue  # keeping nodes does not pay here
            plan = solvers.solve(graph, peak, solver="ilp", selective=True, time_limit_s=30)
            assert plan.status == "optimal" and plan.saved and plan.recompute_cost == cost  # dp is exact on chains
            assert plan.findings["incumbent"] == "dp (kept nodes)"
            assert plan.findings["optimal_over"] == solvers.ilp.KEPT
            checked += 1
        if checked >= 3:
            return
    pytest.fail("no chain where keeping nodes pays")


@pytest.mark.parametrize("i", range(0, len(CASES), 7), ids=[name for name, _ in CASES[::7]])
def test_kept_nodes_with_generator_state_equal_brute_force(i):
    """NOTE [ RNG state per region ] with kept nodes: the frontier program's kept-entry steps carry the
    state of a stochastic region like its plain steps do, and stay equal to the brute force."""
    g = with_randomness(CASES[i][1], i)
    front = pareto_frontier(g)
    program = FrontierDP(g, max_width=64, selective=True)
    assert program.solve(None, objective="peak").objective == front[0][0]
    for peak, _, _ in front:
        want = best_from_frontier(front, peak)[1]
        res = program.solve(peak)
        sim = simulate(g, Plan(regions=res.regions, saved=res.saved), record=False)
        assert sim.peak_bytes <= peak and sim.recompute_cost == res.objective == want, (peak, res)


# ------------------------------------------------------ ilp with its defaults (NOTE [ One plan space ])
#: The other registered solvers the default is held against (CP-SAT, slower, on every tenth graph).
OTHERS = [name for name in solvers.available_solvers(methods=True) if name not in ("ilp", "cp-sat")]


@pytest.mark.parametrize("name,graph", CASES, ids=[name for name, _ in CASES])
def test_ilp_defaults_equal_brute_force_and_beat_every_other_solver(name, graph):
    """``solvers.solve(graph, budget, solver="ilp")`` with no option searches regions and kept nodes, equals the
    brute force over them, says so, and is never worse than any other registered solver."""
    front = pareto_frontier(graph)
    picks = sorted({0, len(front) // 3, (2 * len(front)) // 3, len(front) - 1})
    others = OTHERS + (["cp-sat"] if CASES.index((name, graph)) % 10 == 0 else [])
    for budget in [front[i][0] for i in picks] + [front[picks[-1] // 2][0] + 1]:
        plan = solvers.solve(graph, budget, solver="ilp")
        assert plan.status == "optimal" and plan.findings["optimal_over"] == ilp_mod.KEPT, plan.findings
        assert plan.peak_bytes <= budget and plan.recompute_cost == best_from_frontier(front, budget)[1]
        for other in others:
            try:
                theirs = solvers.solve(graph, budget, solver=other)
            except solvers.CkptError:
                continue  # no plan of theirs fits (or none applies): ilp's does
            assert plan.recompute_cost <= theirs.recompute_cost, (other, budget)
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(graph, front[0][0] - 1, solver="ilp")
    assert info.value.min_feasible_bytes == front[0][0]


def test_ilp_defaults_are_the_default_everywhere():
    """The same set of plans in ``solve``, ``fit``, ``compare`` and the CLI: each reaches ``ilp``'s defaults."""
    for name in ("ilp", "frontier", "cp-sat", "dp"):
        assert next(o for o in solvers.solver_info(name).options if o.name == "selective").default is True
