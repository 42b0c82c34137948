"""What a plan adds besides recompute is priced and chosen on (NOTE [ Plan overheads ] in solvers.model.overheads,
NOTE [ Merging regions for their overhead ] in solvers.merge, NOTE [ Overhead calibration ] in
scheduler.tracing.overheads). Figures are injected: no test reads the clock."""

from __future__ import annotations

import dataclasses

import pytest

import solvers
from chunk_graphs import lm_graph
from graphs import COSTS_META
from solvers import InfeasibleBudget, Plan, simulate
from solvers.menus.chunks import solve_chunked
from solvers.model.chunks import chunk_entries
from solvers.model.overheads import Overheads, graph_overheads, with_overheads

RATE = 1e9  # FLOP-equivalents per second of the test graphs
ROWS_META = {"inputs": [{"shape": [2, 8], "dtype": "int64"}, {"shape": [2, 8], "dtype": "int64"}]}  # 16 token rows


def _priced(g, **figures):
    g = dataclasses.replace(g, nodes=tuple(dataclasses.replace(nd, sac_op=0) if nd.name == "fc0" else nd
                                           for nd in g.nodes))  # a node a policy can keep
    g = dataclasses.replace(g, meta={**g.meta, **ROWS_META, COSTS_META: {"flops_per_s": RATE,
                                                                       "peaks": {"bytes_per_s": 1e10}}})
    return with_overheads(g, figures) if figures else g


def _ilp(g, b):
    return solvers.solve(g, b, "ilp", selective=False)


def test_every_term_is_in_the_predicted_cost():
    g = _priced(lm_graph(blocks=2), region_s=1e-5, selective_op_s=1e-6, kept_call_s=2e-6, chunk_s=3e-5, op_s=1e-6,
                gemm_rows=[(1, 1e9), (16, 4e9)])
    chunks = chunk_entries(g, 4)
    plan = Plan(regions=((1, 3), (4, 6)), saved=(1,), chunks=chunks)
    sim = simulate(g, plan)
    o = sim.overhead_s
    assert o["regions"] == pytest.approx(2e-5)
    assert o["selective"] == pytest.approx(2 * 1e-6 * 3 + 2e-6)  # one region keeps a call: 3 nodes, twice
    first, last, k = chunks[0]
    call = g.nodes[first:last + 1]
    assert o["chunk_loop"] == pytest.approx(3 * 3e-5)
    assert o["chunk_launches"] == pytest.approx(3 * 1e-6 * len(call))
    assert o["chunk_accumulation"] == pytest.approx(3 * 3 * sum(nd.param_bytes for nd in call) / 1e10)
    flops = sum(nd.fwd_flops + nd.bwd_flops for nd in call if nd.op == "aten.linear.default")
    # 16 rows at 4e9 FLOP/s; 4 rows a chunk at 2.5e9 (log-linear between 1 and 16 rows)
    assert flops and o["chunk_gemm"] == pytest.approx(flops * (1 / 2.5e9 - 1 / 4e9))
    assert sim.overhead_cost == round(sum(o.values()) * RATE)
    assert sim.total_cost == sim.recompute_cost + sim.overhead_cost
    assert sim.extra_time_s == pytest.approx(sim.recompute_time_s + sum(o.values()))
    # without figures (an old graph, the tests' pinned zero): priced at 0, as before
    bare = simulate(_priced(lm_graph(blocks=2)), plan)
    assert bare.overhead_cost == 0 and bare.recompute_cost == sim.recompute_cost and bare.peak_bytes == sim.peak_bytes


def test_a_solved_plan_reports_its_extra_time_split():
    g = _priced(lm_graph(blocks=2), region_s=1e-5)
    plan = solvers.solve(g, int(simulate(g).peak_bytes * 0.8), "dp")
    f = plan.findings
    assert f["extra_regions_s"] == pytest.approx(1e-5 * len(plan.regions)) and plan.regions
    assert f["extra_time_s"] == pytest.approx(f["extra_recompute_s"] + f["extra_regions_s"])
    assert f["extra_recompute_s"] == pytest.approx(plan.recompute_time_s)


def test_with_a_region_overhead_fewer_regions_at_equal_recompute_are_preferred():
    def two(graph, budget_bytes):  # a solver answering two regions that tile one interval
        return Plan(regions=((1, 2), (3, 3)), status="feasible")

    for region_s, expect in ((0.0, ((1, 2), (3, 3))), (1e-5, ((1, 3),))):
        g = _priced(lm_graph(blocks=2), region_s=region_s).unaligned()
        budget = simulate(g).peak_bytes
        plan = solvers.solve(g, budget, two)
        assert plan.regions == expect, region_s
        assert plan.peak_bytes <= budget
    # a merge that would not fit is not made
    g = _priced(lm_graph(blocks=2), region_s=1e-5).unaligned()
    tight = max(simulate(g, Plan(regions=((1, 2), (3, 3)))).peak_bytes, 1)
    if simulate(g, Plan(regions=((1, 3),))).peak_bytes > tight:
        assert solvers.solve(g, tight, two).regions == ((1, 2), (3, 3))


def test_with_a_chunk_loop_cost_fewer_chunks_are_picked_when_they_fit():
    base = _priced(lm_graph(blocks=2))
    floors = []
    for k in (1, 2):
        with pytest.raises(InfeasibleBudget) as info:
            solve_chunked(base, 1, _ilp, (k,))
        floors.append(info.value.min_feasible_bytes)
    low, top = max(floors), simulate(base).peak_bytes
    for budget in range(low, top, max(1, (top - low) // 20)):  # a budget where 2 chunks recompute less than 1
        one = solve_chunked(base, budget, _ilp, (1,))
        two = solve_chunked(base, budget, _ilp, (2,))
        if one.recompute_cost > two.recompute_cost:
            break
    else:
        pytest.fail("no budget where chunks save recompute")
    # no overheads: the menu takes the least recompute, two chunks
    assert solve_chunked(base, budget, _ilp, (1, 2)).findings["head_chunks"] == 2
    # a chunk loop dearer than the recompute chunks save: one chunk, the lower total
    gap_s = (one.recompute_cost - two.recompute_cost) / RATE
    priced = _priced(lm_graph(blocks=2), chunk_s=2 * gap_s)
    picked = solve_chunked(priced, budget, _ilp, (1, 2))
    assert not picked.chunks and picked.recompute_cost == one.recompute_cost
    assert picked.findings["extra_time_s"] < simulate(priced, two).extra_time_s
    # a loop cheaper than the recompute it saves still chunks
    cheap = solve_chunked(_priced(lm_graph(blocks=2), chunk_s=gap_s / 4), budget, _ilp, (1, 2))
    assert cheap.findings["head_chunks"] == 2 and cheap.findings["extra_chunk_loop_s"] == pytest.approx(gap_s / 4)


def test_overhead_figures_are_checked_and_read_back():
    o = Overheads(region_s=1e-5, gemm_rows=((128, 2e9), (8, 1e9)))
    assert o.gemm_rows == ((8, 1e9), (128, 2e9)) and o.rate(32) == pytest.approx(1.5e9)
    assert o.rate(1) == 1e9 and o.rate(10**6) == 2e9
    assert Overheads.from_dict(o.to_dict()) == o
    with pytest.raises(ValueError, match="region_s"):
        Overheads(region_s=-1.0)
    g = with_overheads(lm_graph(), {})
    assert graph_overheads(g) is None  # all zero: priced as before


def test_overhead_calibration_is_best_of_alternated_rounds(tmp_path):
    from scheduler.tracing.overheads import calibrate_overheads, cpu_overheads

    calls = []

    def measure(threads):
        calls.append(threads)
        slow = 3.0 if threads > 1 and len(calls) == 1 else 1.0  # the first N-thread round ran on a busy machine
        return {"op_s": slow * 1e-6, "region_s": slow * 5e-5, "random_region_s": 1e-5, "selective_op_s": 2e-6,
                "kept_call_s": 1e-6, "chunk_s": 4e-6,
                "gemm_rows": [[32, 1e9 / slow if threads > 1 else 0.8e9], [512, 2e9 if threads > 1 else 2.5e9]]}

    cal = calibrate_overheads(2, rounds=2, measure=measure)
    assert calls == [2, 1, 2, 1]
    f = cal["figures"]
    assert f["region_s"] == 5e-5 and f["op_s"] == 1e-6
    assert dict((m, r) for m, r in f["gemm_rows"]) == {32: 1e9, 512: 2.5e9}  # never below one thread's
    got = cpu_overheads(cache=tmp_path, threads=2, measure=measure)
    again = cpu_overheads(cache=tmp_path, threads=2, measure=lambda t: pytest.fail("measured again"))
    assert got.region_s == again.region_s == 5e-5 and "measured on this machine" in again.source


def test_an_overhead_entry_timed_at_another_gemm_shape_is_measured_again_unless_pinned(tmp_path):
    import json

    from scheduler.tracing.calibration import cache_key
    from scheduler.tracing.overheads import GEMM_COLS, GEMM_TABLE, cpu_overheads

    old = {"op_s": 1e-6, "region_s": 5e-5, "random_region_s": 1e-5, "selective_op_s": 2e-6, "kept_call_s": 1e-6,
           "chunk_s": 0.0, "recompute_op_s": 0.0, "gemm_rows": [[32, 84e9], [2048, 49e9]]}  # [rows, 256] @ [256, 1024]
    path = tmp_path / "plan_overheads.json"
    path.write_text(json.dumps({cache_key(1): {"figures": old, "measured_at": "2026-12-03T07:18:52"}}))
    calls = []

    def measure(threads):
        calls.append(threads)
        return {**old, "region_s": 7e-5, "gemm_rows": [[64, 52e9], [256, 79e9]]}

    got = cpu_overheads(cache=tmp_path, threads=1, measure=measure)
    assert calls == [1, 1] and got.region_s == 7e-5 and got.gemm_rows == ((64, 52e9), (256, 79e9))
    assert json.loads(path.read_text())[cache_key(1)]["figures"]["gemm_cols"] == GEMM_COLS
    assert json.loads(path.read_text())[cache_key(1)]["figures"]["gemm_table"] == GEMM_TABLE
    cpu_overheads(cache=tmp_path, threads=1, measure=measure)
    assert calls == [1, 1]  # the new entry is read back
    # the forward's products alone at 16, 64, 256, 1024 rows (the table before the three products): again
    forward_only = {**old, "gemm_rows": [[16, 27e9], [64, 49e9], [256, 68e9], [1024, 52e9]], "gemm_cols": GEMM_COLS}
    path.write_text(json.dumps({cache_key(1): {"figures": forward_only, "measured_at": "2026-12-03T21:20:13"}}))
    assert cpu_overheads(cache=tmp_path, threads=1, measure=measure).gemm_rows == ((64, 52e9), (256, 79e9))
    assert calls == [1, 1, 1, 1]
    path.write_text(json.dumps({cache_key(1): {"figures": old, "measured_at": "fixed", "pinned": True}}))
    assert cpu_overheads(cache=tmp_path, threads=1, measure=lambda t: pytest.fail("measured")).region_s == 5e-5


def test_the_head_table_times_the_forward_input_and_weight_gradient_products(monkeypatch):
    """gemm_rows is the rate of a head's three products together (what the chunk term multiplies: a call's
    forward and backward FLOPs): their FLOPs over their summed times, each product at its own shape."""
    from scheduler.tracing import overheads

    shapes = []

    def timed(fn, repeats=5):
        out = fn()
        shapes.append(tuple(out.shape))
        return {0: 1.0, 1: 2.0, 2: 3.0}[(len(shapes) - 1) % 3]  # seconds of the forward, dX, dW

    monkeypatch.setattr(overheads, "_best_s", timed)
    rate = overheads._head_rate(8, width=4, cols=16)
    assert shapes == [(8, 16), (8, 4), (4, 16)]  # [rows, cols], [rows, width], [width, cols]
    assert rate == pytest.approx(3 * 2 * 8 * 4 * 16 / 6.0)


def test_a_trace_carries_the_overhead_figures():
    import torch

    import scheduler

    g = scheduler.trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),))
    assert "overheads" in g.meta["costs"] and graph_overheads(g) is None  # the tests' pinned zero figures
    assert "overheads" not in g.to_dict().get("fingerprint", "")


def test_a_merge_adding_recompute_is_made_only_where_the_plan_is_not_proven_optimal():
    g = _priced(lm_graph(blocks=2), region_s=1e-5).unaligned()
    assert g.nodes[2].fwd_cost < 1e-5 * RATE  # the gap's recompute costs less than the call saved
    budget = simulate(g).peak_bytes
    for status, expect in (("optimal", ((1, 1), (3, 3))), ("feasible", ((1, 3),))):
        plan = solvers.solve(g, budget, lambda graph, b, s=status: Plan(regions=((1, 1), (3, 3)), status=s))
        assert plan.regions == expect and plan.status == status


def _region_plans(g):
    """Every plan of non-overlapping allowed regions (no kept nodes) of a module-aligned graph."""
    spans = [r for r in g.allowed_regions() if all(g.nodes[i].recomputable for i in range(r[0], r[1] + 1))]
    out = [()]
    for r in sorted(spans):
        out += [p + (r,) for p in out if all(q[1] < r[0] for q in p)]
    return out


def test_the_exact_solver_minimises_recompute_plus_region_calls():
    """ilp's program prices each region's call in its objective: at every budget its plan is the least total
    over all region plans (brute force), and where calls weigh, it takes fewer regions for more recompute, a
    trade the merge pass never makes on a proven-optimal plan."""
    base, priced = _priced(lm_graph(2, blocks=3)), _priced(lm_graph(2, blocks=3), region_s=1e-5)
    plans = _region_plans(priced)
    with pytest.raises(InfeasibleBudget) as info:
        _ilp(priced, 1)
    low, top = info.value.min_feasible_bytes, simulate(priced).peak_bytes
    traded = 0
    for budget in range(low, top, max(1, (top - low) // 12)):
        fits = [simulate(priced, Plan(regions=p), record=False) for p in plans]
        least = min(s.total_cost for s in fits if s.peak_bytes <= budget)
        got = _ilp(priced, budget)
        assert got.status == "optimal" and got.peak_bytes <= budget
        assert simulate(priced, got).total_cost == least, budget
        plain = _ilp(base, budget)  # the recompute optimum, priced with the calls
        if len(got.regions) < len(plain.regions) and got.recompute_cost > plain.recompute_cost:
            traded += 1
            assert "regions_merged" not in got.findings  # the program's choice, not the merge pass's
    assert traded


def test_kept_nodes_are_taken_only_where_they_save_more_than_their_bookkeeping():
    base = _priced(lm_graph(blocks=2))
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(base, 1, "ilp")
    low, top = info.value.min_feasible_bytes, simulate(base).peak_bytes
    for budget in range(low, top, max(1, (top - low) // 40)):
        kept = solvers.solve(base, budget, "ilp")
        plain = _ilp(base, budget)
        if kept.saved and kept.recompute_cost < plain.recompute_cost:
            break
    else:
        pytest.fail("no budget where keeping a node saves recompute")
    gap_s = (plain.recompute_cost - kept.recompute_cost) / RATE
    dear = _priced(lm_graph(blocks=2), selective_op_s=gap_s)  # the dispatch modes cost more than the call saves
    got = solvers.solve(dear, budget, "ilp")
    assert not got.saved and got.recompute_cost == plain.recompute_cost and got.peak_bytes <= budget
    assert simulate(dear, got).total_cost < simulate(dear, kept).total_cost
    cheap = _priced(lm_graph(blocks=2), selective_op_s=gap_s / 100)  # they cost less: the node is kept
    assert solvers.solve(cheap, budget, "ilp").saved == kept.saved


def test_the_selective_bookkeeping_counts_every_aten_call_of_a_node():
    g = _priced(lm_graph(blocks=2), selective_op_s=1e-6)
    plan = Plan(regions=((1, 3),), saved=(1,))
    one = simulate(g, plan).overhead_s["selective"]
    assert one == pytest.approx(2 * 1e-6 * 3)  # nodes without a dispatch list: one call each
    folded = dataclasses.replace(g, nodes=tuple(
        dataclasses.replace(nd, dispatch=("aten.t.default", "aten.addmm.default", "aten.view.default"))
        if nd.name == "out0" else nd for nd in g.nodes))  # a linear node: three calls through the modes
    assert simulate(folded, plan).overhead_s["selective"] == pytest.approx(2 * 1e-6 * 5)


def test_an_overhead_measured_as_a_difference_is_the_median_of_the_rounds():
    from scheduler.tracing.overheads import calibrate_overheads

    seen = []

    def measure(threads):  # the first round's plain region ran slow, so its difference came out low
        seen.append(threads)
        low = len(seen) == 1
        return {"op_s": 1e-6 if low else 2e-6, "region_s": 5e-5, "selective_op_s": 1e-6 if low else 1.5e-5,
                "kept_call_s": 1e-6, "chunk_s": 4e-6, "recompute_op_s": 1e-5, "random_region_s": 0.0,
                "gemm_rows": []}

    f = calibrate_overheads(1, rounds=3, measure=measure)["figures"]
    assert f["selective_op_s"] == 1.5e-5 and f["op_s"] == 1e-6  # a difference: the median; one time: the least
