"""Chunk menus (NOTE [ Chunk menus ] in solvers.menus.chunks, NOTE [ Chunk counts and rows ] in solvers.model.chunks):
a menu skips the calls that cannot run in chunks and chunks the rest, counts are capped by the rows before any
chunked graph is built, a node grouping an MLP is a row-wise call, and the answer is ``optimal`` only where every
member of the menu proved it."""

from __future__ import annotations

import dataclasses

import pytest

import solvers
from chunk_graphs import lm_graph
from graphs import Graph, Node
from solvers import InfeasibleBudget, Plan, simulate
from solvers.model.chunks import ChunkError, chunked_graph, expand, find_calls, find_tail, max_chunks
from solvers.menus.chunks import solve_chunked

ROWS_META = {"inputs": [{"shape": [2, 8], "dtype": "int64"}, {"shape": [2, 8], "dtype": "int64"}]}  # 16 token rows


def _ilp(g, b):
    return solvers.solve(g, b, "ilp", selective=False)


def _least(g, menu, call_menu=(1,)):
    with pytest.raises(InfeasibleBudget) as info:
        solve_chunked(g, 1, _ilp, menu, call_menu)
    return info.value.min_feasible_bytes


def _with_dropout(g: Graph) -> Graph:
    """``g`` with each block's activation drawing random numbers (GPT-2's MLP ends in dropout)."""
    nodes = tuple(dataclasses.replace(nd, stochastic=True) if nd.name.startswith("act") else nd for nd in g.nodes)
    return dataclasses.replace(g, nodes=nodes)


def test_a_menu_skips_calls_that_cannot_run_in_chunks_and_chunks_the_rest():
    """A stock GPT-2's pair --chunks 1,2,4,8,16 --mlp-chunks 1,2,4 once failed with 'no call of this graph is
    row-wise' although its head alone chunks: the MLP menu is skipped, the head chunked, the skip said."""
    g = _with_dropout(lm_graph(blocks=2))
    assert not find_calls(g) and find_tail(g).head == "lm_head"
    budget = _least(g, (1, 2, 4))
    plan = solve_chunked(g, budget, _ilp, (1, 2, 4), (1, 2))
    assert plan.chunk_modules == ("lm_head+loss",) and plan.findings["head_chunks"] > 1
    assert "MLPs are not chunked" in plan.findings["chunks_skipped"]
    assert "'block0'" in plan.findings["chunks_skipped"] and "random numbers" in plan.findings["chunks_skipped"]
    assert simulate(g, plan).peak_bytes <= budget
    # the other way round: a head that is not row-wise, MLPs that are
    h = lm_graph(blocks=2, tail_op="aten.bmm.default")
    plan = solve_chunked(h, simulate(h).peak_bytes, _ilp, (1, 2, 4), (1, 2))
    assert "the head is not chunked" in plan.findings["chunks_skipped"]
    # nothing that can run in chunks: refused, with the reason of each menu
    with pytest.raises(ChunkError, match="the head is not chunked.*; the MLPs are not chunked"):
        solve_chunked(_with_dropout(h), 10**9, _ilp, (1, 2, 4), (1, 2))
    with pytest.raises(ChunkError, match="MLPs are not chunked.*random numbers"):
        solve_chunked(g, 10**9, _ilp, (1,), (1, 2))


def test_a_node_grouping_an_mlp_is_a_row_wise_call():
    """At a coarse granularity an MLP is one node running its products (``5 ops (aten.linear.default...)``): a
    32-layer Llama-3-8B traced at ``auto`` once had no chunkable MLP where its 2-layer page had two."""
    g = lm_graph(blocks=2)
    nodes, spans = list(g.nodes), []
    for b in range(2):
        fc, act, out = (g.index[f"{p}{b}"] for p in ("fc", "act", "out"))
        grouped = Node(f"mlp{b}", inputs=nodes[fc].inputs, out_bytes=nodes[out].out_bytes,
                       fwd_flops=sum(nodes[i].fwd_flops for i in (fc, act, out)), op="3 ops (aten.linear.default...)",
                       param_bytes=nodes[fc].param_bytes + nodes[out].param_bytes,
                       dispatch=("aten.t.default", "aten.mm.default", "aten.gelu.default", "aten.t.default",
                                 "aten.mm.default"), members=(f"fc{b}", f"act{b}", f"out{b}"))
        nodes[fc:out + 1] = [grouped, None, None]
    names = {f"out{b}": f"mlp{b}" for b in range(2)}
    kept = [dataclasses.replace(nd, inputs=tuple(names.get(x, x) for x in nd.inputs),
                                saves_inputs=tuple(names.get(x, x) for x in nd.saves_inputs)) for nd in nodes if nd]
    spans = [dataclasses.replace(sp, first=i, last=i) for i, sp in zip((0, 1, 2), g.spans[:3])] + \
        [dataclasses.replace(g.spans[-1], first=g.spans[-1].first - 4, last=g.spans[-1].last - 4)]
    grouped_graph = Graph(nodes=tuple(kept), spans=tuple(spans), param_bytes=g.param_bytes, input_bytes=g.input_bytes)
    assert [sp.module for sp in find_calls(grouped_graph)] == ["block0", "block1"]
    gk = chunked_graph(grouped_graph, 1, 4)
    assert [nd.name for nd in gk.nodes if nd.name.startswith("mlp0@")] == [f"mlp0@{c}" for c in range(4)] + ["mlp0@cat"]
    least = _least(grouped_graph, (1,), (1, 2, 4))
    assert least <= _least(grouped_graph, (1,))
    plan = solve_chunked(grouped_graph, least, _ilp, (1,), (1, 2, 4))
    assert simulate(grouped_graph, plan).peak_bytes <= least and "chunks_skipped" not in plan.findings


def test_chunk_counts_are_capped_by_the_rows():
    """--chunks 1000000 / 10**30 and plan files edited to 10**6 chunks were accepted and never answered (expand
    built a copy per chunk): a count above the call's rows is refused before any copy, or dropped from a menu."""
    g = dataclasses.replace(lm_graph(blocks=2), meta=ROWS_META)
    first, last = find_tail(g).first, len(g) - 1
    assert max_chunks(g, first, last) == 16
    with pytest.raises(ChunkError, match="at most 16 chunks; got 1000000"):
        solve_chunked(g, 10**9, _ilp, (1, 10**6))
    with pytest.raises(ChunkError, match=r"at most 16 chunks; got 100\.\.\.\(31 digits\)"):
        solve_chunked(g, 10**9, _ilp, (10**30,))
    with pytest.raises(ChunkError, match="at most 16 chunks; got 100000"):
        solve_chunked(g, 10**9, _ilp, (1,), (1, 100000))
    plan = solve_chunked(g, _least(g, (1, 2, 4)), _ilp, (1, 2, 4, 32))  # a menu: 32 dropped, said
    assert "counts 32 dropped, above its 16 rows" in plan.findings["chunks_skipped"]
    for k in (17, 1000, 10**30):
        with pytest.raises(ChunkError, match="at most 16; solve again"):
            expand(g, [(first, last, k)])
        with pytest.raises(solvers.PlanError, match="more than the 16 rows its step was traced with can have: at most 16"):
            Plan(regions=(), chunks=((first, last, k),), graph_meta=ROWS_META)
    saved = dataclasses.replace(plan, chunks=((first, last, 2),)).to_dict()
    saved["chunks"] = [[first, last, 10**6]]
    with pytest.raises(solvers.PlanError, match="runs in 1000000 chunks, more than the 16 rows"):
        Plan.from_dict(saved)
    # a classifier's step: its head over one image's row (labels [1]), its MLPs over more rows (the pixels bound
    # them): the head's menu is skipped, said, and the MLPs chunked
    image = dataclasses.replace(lm_graph(blocks=2), meta={"inputs": [{"shape": [1, 3, 8, 8], "dtype": "float32"},
                                                                     {"shape": [1], "dtype": "int64"}]})
    assert max_chunks(image, first, last) == 1 and max_chunks(image, 1, 3) == 192
    plan = solve_chunked(image, simulate(image).peak_bytes, _ilp, (1, 2, 4), (1, 2))
    assert "'lm_head' with its loss has at most 1 rows" in plan.findings["chunks_skipped"]
    assert "head_chunks" not in plan.findings or plan.findings["head_chunks"] == 1
    # a graph that records no inputs: the bytes of the tensor the call reads bound its rows
    bare = lm_graph(blocks=2)
    most = max_chunks(bare, first, last)
    assert most == bare.nodes[first - 1].out_bytes
    with pytest.raises(ChunkError, match=f"at most {most}; solve again"):
        expand(bare, [(first, last, 10**30)])


def _member_says(status_of):
    """``_ilp``, with each member's plan relabelled by ``status_of(graph, plan)`` (a solve stopped at a gap)."""
    def solve(g, b):
        return status_of(g, _ilp(g, b))
    return solve


def test_a_menu_is_optimal_only_when_every_member_proved_it():
    """A chunk menu once answered ``optimal`` while one of its solves stopped ``feasible`` at an 86 % gap."""
    g = lm_graph(seed=0, blocks=1)
    budget = max(_least(g, (2,)), _least(g, (4,)))  # both chunked members fit, the plain one does not
    exact = solve_chunked(g, budget, _ilp, (1, 2, 4))
    assert exact.status == "optimal" and exact.recompute_cost > 0 and "menu_unproven" not in exact.findings
    k_best = exact.findings.get("head_chunks", 1)
    other = next(k for k in (2, 4) if k != k_best)

    def gap_at(bound):
        def relabel(gg, plan):  # the member with `other` chunks stopped at a gap above `bound`
            if len(gg) != len(chunked_graph(g, other)):
                return plan
            return dataclasses.replace(plan, status="feasible", bound=bound,
                                       gap=(plan.recompute_cost - bound) / max(plan.recompute_cost, 1))
        return relabel

    weak = solve_chunked(g, budget, _member_says(gap_at(0.0)), (1, 2, 4))
    assert weak.regions == exact.regions and weak.recompute_cost == exact.recompute_cost
    assert weak.status == "feasible" and weak.bound == 0.0 and weak.gap == 1.0
    assert f"head {other}, MLPs 1: feasible" in weak.findings["menu_unproven"]
    # a member whose proven bound is no lower than the answer could not have done better: still optimal
    strong = solve_chunked(g, budget, _member_says(gap_at(float(exact.recompute_cost))), (1, 2, 4))
    assert strong.status == "optimal"
    # a member that stopped at the time limit: feasible, no bound known
    from solvers.deadline import OutOfTime

    def stops(gg, b):
        if len(gg) == len(chunked_graph(g, other)):
            raise OutOfTime("stopped at the time limit")
        return _ilp(gg, b)

    stopped = solve_chunked(g, budget, stops, (1, 2, 4))
    assert stopped.status == "feasible" and stopped.bound is None and "stopped at the time limit" in \
        stopped.findings["menu_unproven"]
    # the member proven infeasible (k = 1 at this budget) left the exact answer optimal
    assert budget < _least(g, (1,)) and k_best != 1


def test_ckpt_solve_refuses_chunk_counts_above_the_rows_in_one_line(tmp_path, capsys):
    import graphs
    from scheduler.cli import main

    g = dataclasses.replace(lm_graph(blocks=2), meta=ROWS_META)
    graphs.save(g, tmp_path / "g.json")
    argv = ["solve", str(tmp_path / "g.json"), "--budget", "1.0"]
    for flags, most in ((["--chunks", "1000000"], 16), (["--chunks", str(10**30)], 16),
                        (["--mlp-chunks", "100000"], 16)):
        assert main(argv + flags) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"at most {most} chunks" in err


def test_each_pair_of_a_menu_gets_its_share_of_the_time_limit():
    """Each pair once took all the time left: on a Llama (hidden 256, 4 layers, 2 x 512 tokens, 20 s) the head in
    one piece searched 15 s at a budget only more chunks reach, and the head in 4 chunks, which fits, had 0.3 s:
    "no plan found". Here (a hand clock) a search spends all it is given and finds nothing with fewer than 4 chunks:
    each pair is given an even share of what is left, and the plan in 4 chunks comes back."""
    from solvers.deadline import Deadline, OutOfTime

    g = lm_graph(blocks=2, vocab_x=16)
    now = [0.0]
    deadline = Deadline(30.0, clock=lambda: now[0])
    given: list[float] = []

    def search(h, b, limit_s):  # noqa: ANN001
        given.append(limit_s)
        if any("@chunk3/4" in sp.module for sp in h.spans):  # the head in 4 chunks: found at once
            return solvers.solve(h, b, "ilp", selective=False)
        now[0] += limit_s  # the others search until their share is spent
        raise OutOfTime(f"no plan within {limit_s:g} s")

    plan = solve_chunked(g, 10**12, search, (1, 2, 4), (1,), deadline=deadline)
    assert given == pytest.approx([10.0, 10.0, 10.0])
    assert plan.findings["head_chunks"] == 4
    with pytest.raises(OutOfTime):  # every pair stopped: the stop is said
        solve_chunked(g, 10**12, search, (1, 2), (1,), deadline=Deadline(30.0, clock=lambda: now[0]))
