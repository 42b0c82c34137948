"""Every registered solver through the same battery, checked by ``simulate``."""

from __future__ import annotations

import pytest

import solvers
from graphs import synthetic
from solvers import InfeasibleBudget, activation_budget_bytes, simulate
from solvers.baselines import NoModulePaths
from solvers.frontier.program import TooWide

GRAPHS = {
    "hetero-chain-24": synthetic.make("hetero-chain", 24, seed=1),
    "residual-20": synthetic.make("residual", 20, seed=2),
    "unet-20": synthetic.make("unet", 20, seed=3),
    "transformer-28": synthetic.make("transformer", 28, seed=4),
    "random-dag-18": synthetic.make("random-dag", 18, seed=5),
}
FRACTIONS = (0.3, 0.5, 0.7, 1.0)
OPTIONS = {"ilp": {"time_limit_s": 10, "workers": 2}, "cp-sat": {"time_limit_s": 10, "workers": 2},
           "frontier": {"time_limit_s": 10}}
#: Every registered solver, ilp's methods (frontier, cp-sat) included. The
#: exact ones' cost is monotone in the budget by optimality; the others pick
#: the cheapest of a budget-independent candidate set that fits, which is
#: monotone too: the test holds for all.
ALL = solvers.available_solvers(methods=True)


def _sweep(name, graph):
    plans = []
    for f in FRACTIONS:
        budget = activation_budget_bytes(graph, f)
        try:
            plan = solvers.solve(graph, budget, solver=name, **OPTIONS.get(name, {}))
        except InfeasibleBudget as exc:
            assert exc.min_feasible_bytes > budget
            # The error carries the plan that reaches its least peak (dp's is its prediction, never below simulate's).
            reached = simulate(graph, solvers.Plan(regions=exc.best_regions)).peak_bytes
            assert reached == exc.min_feasible_bytes if name != "dp" else reached <= exc.min_feasible_bytes
            plans.append((budget, None, exc.min_feasible_bytes))
            continue
        except NoModulePaths:
            assert name == "per-module" and not any(nd.module for nd in graph.nodes)
            return None
        except TooWide as exc:  # the frontier program alone refuses wide graphs, saying what to use
            assert name == "frontier" and "'ilp' or 'cp-sat'" in str(exc) and isinstance(exc, solvers.CkptError)
            return None
        plans.append((budget, plan, None))
    return plans


@pytest.mark.parametrize("gname", list(GRAPHS))
@pytest.mark.parametrize("name", ALL)
def test_solver_battery(name, gname):
    graph = GRAPHS[gname]
    plans = _sweep(name, graph)
    if plans is None:
        return
    if name in solvers.exact_solvers():  # the exact ones agree with each other at every budget
        ref = _sweep("ilp", graph) if name != "ilp" else plans
        assert [p.recompute_flops if p else m for _, p, m in plans] == [p.recompute_flops if p else m
                                                                        for _, p, m in ref]
    last_cost = None
    least = None
    for budget, plan, min_feasible in plans:
        if plan is None:
            assert last_cost is None, "a bigger budget became infeasible"
            least = min_feasible if least is None else least
            continue
        sim = simulate(graph, plan)
        assert sim.peak_bytes <= budget  # fits
        assert plan.peak_bytes == sim.peak_bytes and plan.recompute_flops == sim.recompute_flops  # reported == simulate
        assert plan.status in ("optimal", "feasible")
        if least is not None:
            assert least <= budget  # the least feasible budget it reported was honest
            assert simulate(graph, plan).peak_bytes >= 0
        if last_cost is not None:
            assert plan.recompute_flops <= last_cost  # bigger budget never costs more
        last_cost = plan.recompute_flops


def test_store_all_at_full_budget_is_free():
    g = GRAPHS["residual-20"]
    plan = solvers.solve(g, activation_budget_bytes(g, 1.0), solver="dp")
    assert plan.recompute_flops == 0


def test_dp_table_reused_and_exact_on_chain():
    g = synthetic.make("hetero-chain", 40, seed=9)
    t1 = solvers.dp_table(g, max_front=None)
    assert solvers.dp_table(g, max_front=None) is t1
    for f in (0.5, 0.7, 0.9):
        budget = activation_budget_bytes(g, f)
        regions, peak, cost = t1.solve(budget)
        sim = simulate(g, solvers.Plan(regions=regions))
        assert (sim.peak_bytes, sim.recompute_flops) == (peak, cost)


@pytest.mark.parametrize("gname,limit", [("unet-20", 10), ("transformer-28", 10), ("random-dag-18", 10)])
def test_ilp_never_worse_than_fast_solvers(gname, limit):
    g = GRAPHS[gname]
    for f in (0.3, 0.5, 0.8):
        budget = activation_budget_bytes(g, f)
        others = {}
        for other in solvers.ilp.WARM_SOLVERS:
            try:
                others[other] = solvers.solve(g, budget, solver=other).recompute_flops
            except (InfeasibleBudget, NoModulePaths):
                continue
        try:
            plan = solvers.solve(g, budget, solver="ilp", time_limit_s=limit)
        except InfeasibleBudget:
            assert not others, "ilp failed where a fast solver found a plan"
            continue
        assert all(plan.recompute_flops <= c for c in others.values()), (plan.recompute_flops, others)


def test_ilp_time_limit_returns_incumbent_with_gap():
    # 100-node transformer: CP-SAT cannot prove anything in 1 s, so the
    # warm-start plan (or better) comes back as feasible with a gap.
    g = synthetic.make("transformer", 100, seed=0)
    budget = activation_budget_bytes(g, 0.4)
    dp_cost = solvers.solve(g, budget, solver="dp").recompute_flops
    plan = solvers.solve(g, budget, solver="ilp", time_limit_s=1, method="cp-sat")
    assert plan.recompute_flops <= dp_cost
    assert plan.status == "feasible" and plan.gap is not None and 0 <= plan.gap <= 1
    assert plan.bound is not None and plan.bound <= plan.recompute_flops
    # The frontier program proves the same graph optimal (0.8 s here; a generous limit for loaded machines).
    exact = solvers.solve(g, budget, solver="frontier", time_limit_s=120)
    assert exact.status == "optimal" and exact.findings["method"] == "frontier"
    assert exact.recompute_flops <= plan.recompute_flops and exact.bound >= plan.bound


def test_per_module_regions_are_blocks():
    g = GRAPHS["transformer-28"]
    regions = solvers.baselines.block_regions(g)
    assert len(regions) == 2
    for a, b in regions:
        assert len({g.nodes[i].module for i in range(a, b + 1)}) == 1
    with pytest.raises(NoModulePaths, match="module paths"):
        solvers.baselines.block_regions(GRAPHS["hetero-chain-24"])


def test_chen_modes():
    g = GRAPHS["residual-20"]
    budget = activation_budget_bytes(g, 0.8)
    best = solvers.solve(g, budget, solver="chen")
    for mode in ("sqrt", "greedy"):
        try:
            other = solvers.solve(g, budget, solver="chen", mode=mode)
        except InfeasibleBudget:
            continue
        assert best.recompute_flops <= other.recompute_flops
    with pytest.raises(ValueError, match="mode"):
        solvers.solve(g, budget, solver="chen", mode="nope")


def test_cli_solve_all(tmp_path, capsys):
    from graphs import save
    from scheduler.cli import main

    path = tmp_path / "g.json"
    save(GRAPHS["transformer-28"], path)
    out = tmp_path / "plan.json"
    assert main(["solve", str(path), "--budget", "0.5", "--solver", "all", "--time-limit", "5", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    for name in solvers.available_solvers():
        assert name in text
    assert "recompute" in text and out.exists()


# --------------------------------------------------------------- dp kernel
def _tie_chain(seed: int):
    """A random chain whose sizes and FLOPs come from tiny sets (many exact ties
    of peak and cost), with some nodes that cannot be recomputed."""
    import random

    from graphs import Graph, Node

    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(5, 40)):
        inputs = (f"n{i - 1}",) if i else ()
        nodes.append(Node(
            name=f"n{i}", inputs=inputs, saves_inputs=inputs if rng.random() < 0.7 else (),
            saves_output=rng.random() < 0.2, out_bytes=rng.choice([100, 100, 200, 300]),
            saved_bytes=rng.choice([0, 0, 50]), fwd_flops=rng.choice([0, 1, 1, 2]), bwd_flops=2,
            recomputable=rng.random() < 0.93))
    return Graph(nodes=tuple(nodes), input_bytes=100, name=f"ties{seed}")


def _reference_fronts(table):
    """The DP's sets recomputed in plain Python from the table's profiles: every
    candidate listed (stored, then regions by last stage, then by position),
    one stable sort by ``h``, then the Pareto scan and the same thinning."""
    from solvers.dp.profiles import region_profiles

    st = table.stages
    m = len(st)
    l0, cost, inp = region_profiles(table._na, st)
    ref = {(m, 0): ([0], [0], [-2], [0]), (m, 1): ([0], [0], [-2], [0])}
    for i in range(m - 1, -1, -1):
        for lh in (0, 1):
            if (i, lh) not in table._fronts:
                continue
            local, retained, nlh = table._stored[i, lh]
            fh, fc = ref[i + 1, nlh][:2]
            cands = [(max(local, retained + h), c, -1, k) for k, (h, c) in enumerate(zip(fh, fc))]
            extra = int(inp[i]) if lh == 0 else 0
            j = i
            while j < m and all(st.regionable[i:j + 1]):
                fh, fc = ref[j + 1, table._lh_reg[j]][:2]
                floor = int(l0[i, j])
                t = max([k for k, h in enumerate(fh) if h <= floor], default=0)
                cands += [(max(floor + extra, extra + fh[k]), int(cost[i, j]) + fc[k], j, k)
                          for k in range(t, len(fh))]
                j += 1
            front: list[tuple[int, int, int, int]] = []
            for cand in sorted(cands, key=lambda x: x[0]):
                if not front or cand[1] < front[-1][1]:
                    if front and front[-1][0] == cand[0]:
                        front.pop()
                    front.append(cand)
            size = table.max_front
            if size is not None and len(front) > size:
                step = (len(front) - 1) / (size - 1)  # as np.linspace: k * step, the last exact
                keep = sorted({round(k * step) for k in range(size - 1)} | {len(front) - 1})
                front = [front[k] for k in keep]
            ref[i, lh] = tuple(list(col) for col in zip(*front))
    return ref


@pytest.mark.parametrize("max_front", [None, 5])
def test_dp_kernel_matches_plain_python(max_front):
    # Tie-heavy random chains, a homogeneous chain and DAGs with stages: every set
    # of the table (h, cost, and which candidate won each tie) as the plain version.
    graphs = [_tie_chain(seed) for seed in range(25)]
    graphs += [synthetic.make("chain", 50), synthetic.make("residual", 30, seed=1),
               synthetic.make("transformer", 40, seed=2)]
    checked = 0
    for g in graphs:
        table = solvers.dp.chain.DPTable(g, max_front=max_front)
        ref = _reference_fronts(table)
        for key, front in table._fronts.items():
            got = (front.h.tolist(), front.cost.tolist(), front.choice.tolist(), front.nxt.tolist())
            assert got == ref[key], (g.name, key)
            checked += len(front.h)
    assert checked > 1000
