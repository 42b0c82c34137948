"""Chunked head (NOTE [ Chunked head ] in solvers.model.chunks): the chunked graph, simulate, and the exact
solvers choosing k against brute force over the menu."""

from __future__ import annotations

import pytest

import solvers
from chunk_graphs import lm_graph
from graphs import Graph
from solvers import InfeasibleBudget, Plan, brute_force, simulate
from solvers.model.chunks import ChunkError, chunk_entries, chunked_graph, find_calls, find_tail, parse_chunk_module
from solvers.menus.chunks import solve_chunked

MENU = (1, 2, 4)


def test_tail_and_chunked_graph():
    g = lm_graph()
    tail = find_tail(g)
    assert (tail.head, g.nodes[tail.first].name) == ("lm_head", "head")
    gk = chunked_graph(g, 4)
    copies = [sp for sp in gk.spans if parse_chunk_module(sp.module)]
    assert [parse_chunk_module(sp.module) for sp in copies] == [("lm_head+loss", c, 4) for c in range(4)]
    names = [nd.name for nd in gk.nodes]
    assert names.count("labels") == 1 and names.index("labels") < copies[0].first  # the labels run once
    assert [sp.last - sp.first for sp in copies] == [1] * 4  # head and loss in each chunk
    head = g.nodes[tail.first]
    # bytes split exactly where they divide; the parameter gradient is made once (the last chunk's backward)
    assert sum(gk.nodes[sp.first].out_bytes for sp in copies) == head.out_bytes
    assert [gk.nodes[sp.first].param_bytes for sp in copies] == [0, 0, 0, head.param_bytes]
    assert [gk.nodes[sp.first].workspace_bytes for sp in copies] == [head.param_bytes] * 2 + [2 * head.param_bytes, 0]
    assert gk.nodes[-1].inputs == tuple(gk.nodes[sp.last].name for sp in copies)
    assert all(gk.nodes[i].sac_op == -1 for sp in copies for i in range(sp.first, sp.last + 1))  # chunks recompute whole


def test_the_head_is_found_through_a_cast_to_fp32():
    g = lm_graph(upcast=True)
    tail = find_tail(g)
    assert (tail.head, g.nodes[tail.first].name) == ("lm_head", "head")
    gk = chunked_graph(g, 4)
    assert [nd.out_bytes for nd in gk.nodes if nd.name.startswith("upcast@")] == [g.nodes[g.index["upcast"]].out_bytes // 4] * 4


def test_simulate_reads_the_chunked_graph_and_chunking_lowers_the_floor():
    g = lm_graph()
    first = find_tail(g).first
    floors = []
    for k in (2, 4, 8, 16):
        gk = chunked_graph(g, k)
        regions = [(sp.first, sp.last) for sp in gk.spans]
        plan = Plan(regions=regions, chunks=chunk_entries(g, k))
        direct = simulate(gk, Plan(regions=regions))
        assert simulate(g, plan).peak_bytes == direct.peak_bytes
        assert simulate(g, plan).recompute_cost == direct.recompute_cost
        floors.append(direct.peak_bytes)
    least = [solvers.pareto_frontier(gg, selective=False)[0][0]
             for gg in (g, *(chunked_graph(g, k) for k in MENU[1:]))]
    assert least == sorted(least, reverse=True) and least[2] < least[0]
    assert floors == sorted(floors, reverse=True)


def test_plan_json_keeps_chunks(tmp_path):
    g = lm_graph()
    first = find_tail(g).first
    budget = solvers.pareto_frontier(chunked_graph(g, 4), selective=False)[0][0]
    plan = solve_chunked(g, budget, lambda gg, b: solvers.solve(gg, b, "ilp"), MENU)
    assert plan.chunks[0][:2] == (first, len(g) - 1) and plan.chunks[0][2] > 1
    assert plan.chunk_modules == ("lm_head+loss",) and plan.findings["head_chunks"] == plan.chunks[0][2]
    plan.save(tmp_path / "p.json")
    again = solvers.load_plan(tmp_path / "p.json")
    assert again == plan
    plan.check_graph(g)
    assert simulate(g, again).peak_bytes == plan.peak_bytes


@pytest.mark.parametrize("solver", ["ilp", "frontier", "cp-sat", "dp"])
@pytest.mark.parametrize("seed,blocks,menu", [(s, 1, (1, 2, 4)) for s in range(3)] + [(s, 2, (1, 2)) for s in range(3)])
def test_exact_solvers_choose_k_as_brute_force(seed, blocks, menu, solver):
    """The exact solvers equal brute force over the menu; dp (exact on chains only: the chunked graph is
    none) never beats it and fits when it answers."""
    exact = solver in solvers.exact_solvers()
    g = lm_graph(seed, blocks=blocks)
    first = find_tail(g).first
    graphs = {k: g if k == 1 else chunked_graph(g, k) for k in menu}
    fronts = {k: solvers.pareto_frontier(gk, selective=False) for k, gk in graphs.items()}
    least = min(front[0][0] for front in fronts.values())
    assert least < fronts[1][0][0]  # chunking lowers the floor on every case
    store_all = simulate(g).peak_bytes
    for budget in (least - 1, least, (least + store_all) // 2, store_all):
        best = None
        for k, gk in graphs.items():
            try:
                cost = brute_force(gk, budget, selective=False, frontier=fronts[k]).recompute_cost
            except InfeasibleBudget:
                continue
            best = cost if best is None else min(best, cost)
        if best is None:
            with pytest.raises(InfeasibleBudget) as info:
                solve_chunked(g, budget, lambda gg, b: solvers.solve(gg, b, solver, selective=False), menu)
            assert info.value.min_feasible_bytes == least if exact else info.value.min_feasible_bytes >= least
            continue
        try:
            plan = solve_chunked(g, budget, lambda gg, b: solvers.solve(gg, b, solver, selective=False), menu)
        except InfeasibleBudget:
            assert not exact
            continue
        assert plan.recompute_cost == best if exact else plan.recompute_cost >= best
        assert simulate(g, plan).peak_bytes <= budget


def test_a_tail_that_is_not_row_wise_is_refused():
    g = lm_graph(tail_op="aten.bmm.default")
    with pytest.raises(ChunkError, match="aten.bmm.default.*not known to compute each token row alone"):
        find_tail(g)
    plain = Graph(nodes=lm_graph().nodes[:-2], spans=lm_graph().spans)
    with pytest.raises(ChunkError, match="not in a cross-entropy loss"):
        solve_chunked(plain, 10**9, lambda gg, b: solvers.solve(gg, b, "dp"), MENU)


@pytest.mark.parametrize("solver", ["ilp", "frontier", "cp-sat"])
@pytest.mark.parametrize("seed", range(3))
def test_exact_solvers_choose_call_chunks_as_brute_force(seed, solver):
    """A row-wise call (the block's two products) chunked too: the menus' product, against brute force."""
    g = lm_graph(seed, blocks=1)
    assert [sp.module for sp in find_calls(g)] == ["block0"]
    pairs = [(kh, kc) for kh in (1, 2) for kc in (1, 2)]
    graphs = {pair: chunked_graph(g, *pair) for pair in pairs}
    assert max(len(gk) for gk in graphs.values()) == 14
    fronts = {pair: solvers.pareto_frontier(gk, selective=False) for pair, gk in graphs.items()}
    least = min(front[0][0] for front in fronts.values())
    for budget in (least, (least + simulate(g).peak_bytes) // 2):
        best = min(brute_force(graphs[p], budget, selective=False, frontier=fronts[p]).recompute_cost
                   for p in pairs if fronts[p][0][0] <= budget)
        plan = solve_chunked(g, budget, lambda gg, b: solvers.solve(gg, b, solver, selective=False), (1, 2), (1, 2))
        assert plan.recompute_cost == best and simulate(g, plan).peak_bytes <= budget
        if plan.chunks:
            assert set(plan.chunk_modules) <= {"block0", "lm_head+loss"}


def test_chunked_call_graph_joins_the_chunks_with_a_cat():
    g = lm_graph(blocks=2)
    gk = chunked_graph(g, 1, 4)
    cats = [nd for nd in gk.nodes if nd.op == "aten.cat.default"]
    assert [nd.name for nd in cats] == ["out0@cat", "out1@cat"] and all(nd.grad_views for nd in cats)
    assert [nd.out_bytes for nd in cats] == [g.nodes[g.index[n]].out_bytes for n in ("out0", "out1")]
    assert gk.nodes[gk.index["fc1@0"]].inputs == ("out0@cat",)  # the next block reads the joined output
    names = {sp.module for sp in gk.spans}
    assert {"block0@chunk3/4", "block1@chunk0/4", "emb", "lm_head"} <= names and "block0" not in names


def test_bad_chunk_entries_are_refused():
    g = lm_graph(blocks=2)
    with pytest.raises(solvers.PlanError, match="k >= 1 chunks"):
        Plan.from_dict({"regions": [], "chunks": [[4, 5, 0]]})
    with pytest.raises(solvers.PlanError, match=r"k >= 2 chunks \(a fused head: k >= 1\)"):  # no fused head here
        Plan(regions=(), chunks=((find_tail(g).first, len(g) - 1, 1),)).validate(g)
    with pytest.raises(solvers.PlanError, match="overlap"):
        Plan(regions=(), chunks=((1, 3, 2), (3, 6, 2)))
    with pytest.raises(solvers.PlanError, match="no call of this graph that chunks can run"):
        Plan(regions=(), chunks=((0, 0, 2),)).validate(g)  # the embedding: one product, no MLP
    with pytest.raises(solvers.PlanError, match="head 'lm_head' of this graph starts at node"):
        Plan(regions=(), chunks=((0, len(g) - 1, 2),)).validate(g)


def test_ckpt_solve_chunks_then_simulate(tmp_path, capsys):
    """The CLI: --chunks / --mlp-chunks, the plan's chunk fields, simulate on the chunked graph, --solver all."""
    import graphs
    from scheduler.cli import main

    g = lm_graph(blocks=2)
    graphs.save(g, tmp_path / "g.json")
    with pytest.raises(InfeasibleBudget) as info:
        solve_chunked(g, 1, lambda gg, b: solvers.solve(gg, b, "ilp"), (1, 2, 4), (1, 2))
    least = info.value.min_feasible_bytes
    argv = ["solve", str(tmp_path / "g.json"), "--budget", f"{least}B", "--solver", "ilp", "--chunks", "1,2,4",
            "--mlp-chunks", "1,2", "-o", str(tmp_path / "p.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    plan = solvers.load_plan(tmp_path / "p.json")
    assert plan.chunks and "lm_head+loss" in plan.chunk_modules and "lm_head+loss in" in out
    assert main(["simulate", str(tmp_path / "g.json"), str(tmp_path / "p.json")]) == 0
    assert f"peak: {solvers.format_bytes(plan.peak_bytes)}" in capsys.readouterr().out
    assert main(argv[:-2] + ["--solver", "all"]) == 0
    assert "cheapest:" in capsys.readouterr().out
    assert main(argv[:6] + ["--chunks", "0,2"]) != 0
    assert "chunk counts are integers >= 1" in capsys.readouterr().err


def test_chunked_and_nested_solves_share_the_callers_time_limit(monkeypatch):
    """NOTE [ One deadline ]: scheduler.solve's chunked (and nested) solve hands each solve it makes what is left
    of the one limit, and a solve that stops at it leaves the answers found standing (then ``feasible``)."""
    import scheduler
    import scheduler.api
    from solvers.deadline import OutOfTime

    now = [0.0]
    monkeypatch.setattr(scheduler.api, "_clock", lambda: now[0])
    limits: list[float] = []
    real = solvers.solve

    def slow(graph, budget, solver="ilp", **options):  # each solve takes 4 s of the fake clock
        limits.append(options["time_limit_s"])
        if options["time_limit_s"] <= 0:
            raise OutOfTime("stopped at the time limit")
        now[0] += 4.0
        return real(graph, budget, solver=solver, **options)

    monkeypatch.setattr(solvers, "solve", slow)
    g = lm_graph(blocks=2)
    budget = simulate(g).peak_bytes
    plan = scheduler.solve(g, budget, "ilp", chunks=(1, 2, 4, 8), time_limit_s=10.0)
    # one limit, each count an even share of what is left (10/4, 6/3, 2/2; solve_chunked); these solves overrun
    # their shares (4 s each), so the fourth count gets none of it
    assert limits == [2.5, 2.0, 1.0, 0.0]
    assert plan.status == "feasible" and plan.peak_bytes <= budget
    limits.clear()
    now[0] = 0.0
    with pytest.raises(OutOfTime):  # nothing found before the limit: the stop says so
        scheduler.solve(g, budget, "ilp", chunks=(1, 2), time_limit_s=0.0)
    assert limits == [0.0, 0.0]
    limits.clear()
    plan = scheduler.solve(g, budget, "ilp", time_limit_s=10.0)  # one solve: the limit as given
    assert limits == [10.0] and plan.status == "optimal"
    limits.clear()
    plan = scheduler.solve(g, budget, "ilp", nested=True, time_limit_s=0.0)  # the one-level solve stops at once
    assert limits == [0.0] and plan.peak_bytes <= budget and plan.status == "feasible"
