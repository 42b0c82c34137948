"""The frontier program (NOTE [ The frontier DP ]): ilp's exact method on narrow graphs.

Brute force checks it on 240 small graphs (tests/solvers/test_optimality.py); here it
is checked against the CP-SAT model on graphs too big for brute force, and
its limits (width, time) are checked to hand over to CP-SAT or say so.
"""

from __future__ import annotations

import pytest

import graphs
import solvers
from graphs import CkptError, synthetic
from scheduler.cli import main
from solvers import activation_budget_bytes, simulate
from solvers.frontier.program import FrontierDP, FrontierTimeout, TooWide, width
from solvers.ilp import IlpSolver, IlpTimeout


def test_width_counts_open_tensors():
    assert width(synthetic.chain(50)) == 1  # each output is read by the next node only
    g = synthetic.residual(30)
    assert width(g) == 2  # the skip and the main path
    with pytest.raises(TooWide, match="open at one position"):
        FrontierDP(synthetic.make("random-dag", 100), max_width=12)


@pytest.mark.parametrize("fam,n", [("transformer", 29), ("residual", 30), ("unet", 30), ("random-dag", 30),
                                   ("hetero-chain", 40)])
def test_agrees_with_cp_sat_where_it_proves_optimality(fam, n):
    g = synthetic.make(fam, n)
    program = FrontierDP(g)
    checked = 0
    for f in (0.3, 0.5, 0.7, 0.9):
        budget = activation_budget_bytes(g, f)
        res = program.solve(budget)
        cp = IlpSolver(g, budget, time_limit_s=60, workers=2)
        try:
            plan = cp.solve()
        except solvers.InfeasibleBudget as exc:
            assert res is None
            least = program.solve(None, objective="peak")
            assert least.objective == exc.min_feasible_bytes  # both exact: the least peak of any interval plan
            continue
        assert plan.status == "optimal"
        sim = simulate(g, solvers.Plan(regions=res.regions))
        assert sim.peak_bytes <= budget
        assert res.objective == sim.recompute_flops == simulate(g, plan).recompute_flops
        checked += 1
    assert checked >= 2


def test_upper_bound_prunes_exactly():
    g = synthetic.make("transformer", 41)
    budget = activation_budget_bytes(g, 0.5)
    program = FrontierDP(g)
    best = program.solve(budget)
    assert program.solve(budget, upper=best.objective).objective == best.objective
    assert program.solve(budget, upper=best.objective - 1) is None
    assert program.solve(budget, upper=best.objective).states < best.states


def test_ilp_uses_it_on_transformers_and_beats_dp():
    g = synthetic.make("transformer", 101)
    budget = activation_budget_bytes(g, 0.6)
    plan = solvers.solve(g, budget, solver="ilp", time_limit_s=60)
    assert plan.status == "optimal" and plan.findings["method"] == "frontier" and plan.gap == 0
    assert plan.recompute_flops < solvers.solve(g, budget, solver="dp").recompute_flops


def test_ilp_hands_wide_graphs_to_cp_sat_and_says_why_when_forced():
    g = synthetic.make("unet", 100)  # 17 tensors open at once
    budget = activation_budget_bytes(g, 0.8)
    plan = solvers.solve(g, budget, solver="ilp", time_limit_s=60)
    assert plan.findings["method"] in ("cp-sat", "warm start") and plan.status == "optimal"
    with pytest.raises(CkptError, match="narrow graph.*'auto' or 'cp-sat'"):
        solvers.solve(g, budget, solver="ilp", method="frontier")
    with pytest.raises(CkptError, match="option method takes auto|frontier|cp-sat"):
        solvers.solve(g, budget, solver="ilp", method="gurobi")


def test_time_limit(monkeypatch):
    g = synthetic.make("transformer", 101)
    budget = activation_budget_bytes(g, 0.6)
    with pytest.raises(FrontierTimeout):
        FrontierDP(g).solve(budget, time_limit_s=0.0)
    with pytest.raises(IlpTimeout, match="raise time_limit_s"):
        solvers.solve(g, budget, solver="ilp", method="frontier", time_limit_s=0.0)

    # Out of time, auto hands over to CP-SAT with the rest of the limit.
    def slow(self, *args, **kwargs):
        raise FrontierTimeout("no time")

    monkeypatch.setattr(FrontierDP, "solve", slow)
    plan = solvers.solve(g, budget, solver="ilp", time_limit_s=3)
    assert plan.findings["method"] in ("cp-sat", "warm start") and plan.status in ("optimal", "feasible")
    assert plan.peak_bytes <= budget


def test_objective_is_checked():
    with pytest.raises(ValueError, match="objective"):
        FrontierDP(synthetic.chain(5)).solve(None, objective="time")


def test_cli_names_the_method(tmp_path, capsys):
    graphs.save(synthetic.make("transformer", 29), tmp_path / "g.json")
    assert main(["solve", str(tmp_path / "g.json"), "--budget", "0.6", "--solver", "ilp", "--method", "frontier"]) == 0
    out = capsys.readouterr().out
    assert "solver ilp (frontier): status optimal" in out


def test_bounded_free_heuristic_always_fits_and_is_exact_when_it_bounds_nothing():
    """``max_free=k`` counts all but k unheld open tensors as held: its plans
    must fit per simulate at every k, cost no less than the optimum, and equal
    it once k reaches the graph's width."""
    from random_graphs import random_graph

    seen_worse = 0
    for seed in range(100, 160):
        g = random_graph(seed, chain=False)
        program = FrontierDP(g, max_width=None)
        least = program.solve(None, objective="peak").objective
        for budget in (least, least + (solvers.store_all_peak(g).peak_bytes - least) // 3):
            exact = program.solve(budget)
            for k in (0, 1, 2, program.width):
                res = program.solve(budget, max_free=k)
                if res is None:
                    continue
                sim = simulate(g, solvers.Plan(regions=res.regions))
                assert sim.peak_bytes <= budget and sim.recompute_flops == res.objective >= exact.objective
                seen_worse += res.objective > exact.objective
            assert program.solve(budget, max_free=program.width).objective == exact.objective
    assert seen_worse > 0  # the bound binds on some graphs: the test can tell the modes apart


def test_ilp_warm_starts_wide_graphs_from_the_heuristic():
    g = synthetic.make("random-dag", 100)  # 27 open: CP-SAT; dp and chen find no plan at 0.6
    budget = activation_budget_bytes(g, 0.6)
    with pytest.raises(solvers.InfeasibleBudget):
        solvers.solve(g, budget, solver="dp")
    from solvers.frontier.phases import frontier_heuristic

    heur = frontier_heuristic(g, budget, solvers.Deadline(30), None)
    assert heur is not None and simulate(g, solvers.Plan(regions=heur.regions)).peak_bytes <= budget


# ------------------------------------------------ width, decided in linear time
def _zero_byte_variant(seed: int):
    """A random small graph (tests/solvers/test_optimality.py) where some tensors are views of zero bytes."""
    import dataclasses
    import random

    from random_graphs import random_graph

    g = random_graph(seed, chain=seed % 2 == 0)
    rng = random.Random(seed)
    nodes = [dataclasses.replace(nd, out_bytes=0) if i and rng.random() < 0.35 else nd for i, nd in enumerate(g.nodes)]
    return dataclasses.replace(g, nodes=tuple(nodes))


@pytest.mark.parametrize("seed", range(40))
def test_zero_byte_tensors_carry_no_bit_and_stay_exact(seed):
    g = _zero_byte_variant(seed)
    frontier = solvers.pareto_frontier(g)
    program = FrontierDP(g)
    for peak, opt, _ in frontier:
        res = program.solve(peak)
        assert res.objective == opt and simulate(g, solvers.Plan(regions=res.regions)).peak_bytes <= peak
    assert program.solve(None, objective="peak").objective == frontier[0][0]
    assert all(g.nodes[j].out_bytes > 0 for opens in program.opens for j in opens)


def test_width_is_decided_before_anything_is_built(monkeypatch):
    import time

    import solvers.frontier.program as fr

    # 30,000 nodes, 40 tensors read by the last one (and views of zero bytes, which do not count).
    n = 30_000
    nodes = [graphs.Node(f"n{i}", inputs=(f"n{i - 1}",) if i else (), out_bytes=0 if i % 3 == 0 else 8, fwd_flops=1)
             for i in range(n - 1)]
    nodes.append(graphs.Node("loss", inputs=(f"n{n - 2}",) + tuple(f"n{i}" for i in range(0, 120, 3))
                             + tuple(f"n{i}" for i in range(1, 121, 3)), out_bytes=4, fwd_flops=1))
    g = graphs.Graph(nodes=tuple(nodes))
    assert width(g) == 41  # 40 long-lived tensors with bytes and the chain's own
    monkeypatch.setattr(fr, "_open_sets", lambda *a: pytest.fail("open sets built before the width was decided"))
    t0 = time.perf_counter()
    with pytest.raises(TooWide) as info:
        FrontierDP(g)
    assert time.perf_counter() - t0 < 5 and info.value.width == 41 and info.value.max_width == 12
