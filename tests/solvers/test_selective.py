"""Selective recompute (NOTE [ Selective recompute ] in ``solvers.model.simulate``).

Timelines derived by hand on small graphs (the forward hold of a kept node, a
kept region output, a kept sink sharing the caller's storage, own buffers);
``saved=()`` simulating exactly as before; the menu of kept sets (NOTE [ The
menu of kept sets ] in ``solvers.model.selective``); the brute force over
``(region, menu entry)`` pairs never worse than without and sometimes better;
``dp`` equal to that brute force on random chains with spans and saveable
nodes, and unchanged with ``selective=False``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

import pytest

from graphs import Graph, Node, synthetic
from solvers import InfeasibleBudget, Plan, PlanError, enumerate_plans, pareto_frontier, simulate
from solvers.brute_force import best_from_frontier, brute_force, count_selective, enumerate_selective
from solvers.dp.chain import DPTable
from solvers.dp.solver import dp
from solvers.model.selective import variants
from random_graphs import random_graph, random_spans


def _keepable(nd: Node) -> Node:
    return dataclasses.replace(nd, dispatch=("op",), sac_op=0)


def chain3() -> Graph:
    # a -> b -> c, 10 bytes each; b saves its output (as ReLU), c its input; every node keepable.
    # (b saves no input: a region (0, 1) whose last saver saved only inputs would stop its
    # recompute before b's call, and b could not be kept: NOTE [ The menu of kept sets ].)
    return Graph(nodes=tuple(_keepable(nd) for nd in (
        Node("a", out_bytes=10, fwd_flops=1),
        Node("b", inputs=("a",), out_bytes=10, fwd_flops=2, saves_inputs=(), saves_output=True),
        Node("c", inputs=("b",), out_bytes=10, fwd_flops=4),
    )))


# Plans on chain3 and their timelines, by hand. The caller holds grad c (the seed)
# through the backward. Without keeping, region (0, 1) gives
# [10, 20, 20, 40, 40, 50, 50, 30]: fwd a, b (a freed), c; bwd c: b, c + grad c, grad b;
# recompute a: c, a + grads; recompute b: c, a, b + grads (then a freed); bwd b: c, b + 3 grads;
# bwd a: c + grad c, grad a.
CHAIN3_KEPT = {
    # keep a: the cache holds a after b's forward (fwd c: a, b, c = 30); bwd c: 30 + grad c, grad b;
    # b released by c: 20; the recompute reaches a (no allocation): a, c + grads = 40;
    # recompute b: 50 (then a freed); bwd b: b, c + grad c, grad b, grad a = 50; bwd a: c + grad c, grad a = 30.
    (0,): ([10, 20, 30, 50, 40, 50, 50, 30], 2),
    # keep b (a region output, read by c): fwd c: b, c = 20; bwd c: 40, c releases b but the cache
    # holds it; recompute a: a, b, c + grads = 50; reach b: 50; bwd b: b, c + 3 grads = 50.
    (1,): ([10, 20, 20, 40, 50, 50, 50, 30], 1),
    # keep both: nothing is recomputed; the cache holds a and b from the forward to the
    # recompute (a, b, c + grad c, grad b = 50 at both empty recompute steps).
    (0, 1): ([10, 20, 30, 50, 50, 50, 50, 30], 0),
}


@pytest.mark.parametrize("saved", list(CHAIN3_KEPT), ids=str)
def test_chain3_kept_timeline_by_hand(saved):
    live, flops = CHAIN3_KEPT[saved]
    sim = simulate(chain3(), Plan(regions=((0, 1),), saved=saved))
    assert list(sim.live_bytes) == live
    assert sim.recompute_flops == sim.recompute_cost == flops  # kept nodes cost nothing
    assert [p for p, _ in sim.steps].count("recompute") == 2  # a kept node still has its (empty) step


def test_kept_sink_shares_the_callers_storage():
    # a (10) -> b (20, a sink the caller holds), b saves its output; region (0, 1).
    g = Graph(nodes=(Node("a", out_bytes=10, fwd_flops=3),
                     _keepable(Node("b", inputs=("a",), out_bytes=20, fwd_flops=5, saves_inputs=(),
                                    saves_output=True))))
    # Recompute b: a second copy of b, held to b's backward (70, 70). Kept: the cache's b is the
    # caller's b (50, 50).
    assert list(simulate(g, Plan(regions=((0, 1),))).live_bytes) == [10, 30, 50, 70, 70, 50]
    sim = simulate(g, Plan(regions=((0, 1),), saved=(1,)))
    assert list(sim.live_bytes) == [10, 30, 50, 50, 50, 50]
    assert sim.recompute_flops == 3


def test_kept_node_keeps_its_own_buffers_until_its_backward():
    # a -> b (4 bytes of own buffers) -> c; region (0, 1).
    g = Graph(nodes=(Node("a", out_bytes=10, fwd_flops=1),
                     _keepable(Node("b", inputs=("a",), out_bytes=10, saved_bytes=4, fwd_flops=2)),
                     Node("c", inputs=("b",), out_bytes=10, fwd_flops=4)))
    # Not kept: b's buffers die in the forward (20 after b) and return in the recompute (54).
    assert list(simulate(g, Plan(regions=((0, 1),))).live_bytes) == [10, 24, 20, 40, 40, 54, 54, 30]
    # Kept: b and its buffers stay (24 through the forward and c's backward); the recompute of
    # a finds them (54); they are released at b's backward.
    sim = simulate(g, Plan(regions=((0, 1),), saved=(1,)))
    assert list(sim.live_bytes) == [10, 24, 24, 44, 54, 54, 54, 30]


def test_kept_node_without_grad_drops_its_buffers_when_reached():
    # b has no backward: its buffers go when the recompute reaches it, not at a backward step.
    # c (with grad, a sink) saves b, so the recompute of region (0, 2) runs b's call.
    g = Graph(nodes=(Node("a", out_bytes=10, fwd_flops=1, requires_grad=False),
                     _keepable(Node("b", inputs=("a",), out_bytes=10, saved_bytes=4, fwd_flops=2,
                                    requires_grad=False)),
                     Node("c", inputs=("b",), out_bytes=10, fwd_flops=4)))
    sim = simulate(g, Plan(regions=((0, 2),), saved=(1,)))
    # fwd: a 10, b 24, (a freed, b and its buffers held by the cache) c 24; recompute a: 34 + grad c;
    # reach b: 44, then its buffers go and a is freed (20); recompute c: 30 + grad c = 40 (the
    # recomputed c then goes: the caller holds the forward copy); bwd c: b, c + grad c = 30.
    assert list(sim.live_bytes) == [10, 24, 24, 44, 44, 40, 30]
    assert [p for p, _ in sim.steps] == ["forward"] * 3 + ["recompute"] * 3 + ["backward"]


def test_saved_must_lie_in_a_region_and_be_saveable():
    g = chain3()
    with pytest.raises(PlanError, match="lies in no region"):
        Plan(regions=((0, 1),), saved=(2,))
    plain = Graph(nodes=tuple(dataclasses.replace(nd, sac_op=-1) for nd in g.nodes))
    with pytest.raises(PlanError, match="sac_op is -1"):
        simulate(plain, Plan(regions=((0, 1),), saved=(0,)))


def _timeline_digest() -> str:
    h = hashlib.sha256()
    # without outputs (recorded before graphs had them): a graph without outputs simulates as before
    graphs = [dataclasses.replace(random_graph(s, chain=s % 2 == 0), outputs=()) for s in range(40)]
    graphs += [synthetic.make(f, 9, seed=1) for f in ("hetero-chain", "residual", "unet", "random-dag")]
    for gi, g in enumerate(graphs):
        plans = list(enumerate_plans(g))
        for regions in random.Random(gi).sample(plans, min(20, len(plans))):
            sim = simulate(g, Plan(regions=regions))
            h.update(json.dumps([sim.steps, sim.live_bytes, sim.peak_bytes, sim.recompute_flops, sim.recompute_cost,
                                 sorted(sim.breakdown.items()), sim.activation_peak_bytes]).encode())
    return h.hexdigest()[:16]


def test_no_kept_node_simulates_exactly_as_before():
    # Recorded with main's simulate before selective recompute (commit b99573e): 880 plans'
    # whole timelines, breakdowns and costs.
    assert _timeline_digest() == "0f7fdac53487790d"


# ----------------------------------------------------------------------------- the menu
def _menu_graph() -> Graph:
    # cost per byte: n0 2/10, n1 0 (zero cost), n2 9/30 (0.3), n3 not saveable, n4 5/(5+5) = 0.5,
    # n5 3/10 (0.3, ties n2: position decides), n6 7/0 (no bytes: first). n6 saves its output too,
    # so a recompute of a region ending there runs n6's call (NOTE [ The menu of kept sets ]).
    spec = [(10, 0, 2, True), (10, 0, 0, True), (20, 10, 9, True), (10, 0, 50, False), (5, 5, 5, True),
            (10, 0, 3, True), (0, 0, 7, True)]
    nodes = []
    for i, (out, buf, flops, ok) in enumerate(spec):
        nd = Node(f"n{i}", inputs=(f"n{i - 1}",) if i else (), out_bytes=out, saved_bytes=buf, fwd_flops=flops,
                  saves_output=i == 6)
        nodes.append(_keepable(nd) if ok else nd)
    return Graph(nodes=tuple(nodes))


def test_menu_ranks_by_cost_per_byte_and_takes_prefixes():
    g = _menu_graph()
    # ranking: n6, n4, n2, n5, n0 (n1 costs nothing, n3 cannot be kept)
    assert variants(g, 0, 6, limit=8) == [(), (6,), (4, 6), (2, 4, 5, 6), (0, 2, 4, 5, 6)]
    assert variants(g, 0, 6) == [(), (6,), (4, 6), (0, 2, 4, 5, 6)]  # limit 4: the whole list stays
    assert variants(g, 0, 6, limit=2) == [(), (0, 2, 4, 5, 6)]
    assert variants(g, 0, 6, limit=1) == [()]
    assert variants(g, 2, 2) == [(), (2,)]
    assert variants(g, 1, 1) == [()]  # zero cost saved: never offered
    assert variants(g, 3, 3) == [()]  # no saveable node
    for a in range(7):
        for b in range(a, 7):
            menu = variants(g, a, b)
            assert menu[0] == () and len(set(menu)) == len(menu) <= 4
            assert all(e == tuple(sorted(e)) and all(a <= k <= b for k in e) for e in menu)


@pytest.mark.parametrize("bad", [dict(first=3, last=2), dict(first=0, last=7), dict(first=0, last=1, limit=0)], ids=str)
def test_menu_refuses_bad_input(bad):
    with pytest.raises(ValueError, match="region|limit"):
        variants(_menu_graph(), **bad)


# ---------------------------------------------------------------- brute force and dp
def sac_graph(seed: int) -> Graph:
    """A random chain of 4 to 9 nodes with random spans and about half its nodes keepable."""
    g = random_graph(seed, chain=True)
    g = dataclasses.replace(g, spans=tuple(random_spans(len(g), random.Random(7000 + seed), laminar=seed % 3 != 0)))
    return synthetic.mark_saveable(g, 0.5, seed=seed)


SEEDS = list(range(200))


def test_brute_force_enumerates_every_menu_entry():
    g = sac_graph(3)
    got = list(enumerate_selective(g))
    assert len(got) == count_selective(g) == len(set(got))
    assert {r for r, _ in got} == set(enumerate_plans(g))
    assert sum(1 for _, s in got if s) > 0


def test_selective_brute_force_is_never_worse_and_sometimes_better():
    better = 0
    for seed in SEEDS[:80]:
        g = sac_graph(seed)
        plain, sac = pareto_frontier(g, selective=False), pareto_frontier(g)
        assert sac[0][0] <= plain[0][0]  # the least peak never rises
        for peak, cost, _ in plain:
            assert best_from_frontier(sac, peak)[1] <= cost
        better += [tuple(p[:2]) for p in sac] != [tuple(p[:2]) for p in plain]
        assert all(not p.saved for p in plain)
    assert better >= 5


def test_brute_force_plan_carries_its_kept_nodes():
    for seed in SEEDS:
        g = sac_graph(seed)
        front = pareto_frontier(g)
        point = next((p for p in front if p.saved), None)
        if point is None:
            continue
        plan = brute_force(g, point[0], frontier=front)
        assert plan.saved == point.saved and plan.regions == point[2]
        sim = simulate(g, plan)
        assert (sim.peak_bytes, sim.recompute_cost) == (plan.peak_bytes, plan.recompute_cost) == tuple(point[:2])
        assert plan.save_ops and sum(len(r) for r in plan.save_ops) == len(plan.saved)
        return
    pytest.fail("no random graph had a plan that keeps a node")


@pytest.mark.parametrize("seed", SEEDS)
def test_dp_equals_brute_force_over_menu_entries(seed):
    g = sac_graph(seed)
    front = pareto_frontier(g)
    table = DPTable(g, max_front=None)
    assert table.is_chain and table.exact
    assert table.min_peak_bytes == front[0][0]
    for peak, cost, _ in front:
        for budget in (peak, peak + 1):
            regions, predicted, got = answer = table.solve(budget)
            sim = simulate(g, Plan(regions=regions, saved=answer.saved))
            assert (sim.peak_bytes, sim.recompute_cost) == (predicted, got)  # the table's own prediction is exact
            assert got == best_from_frontier(front, budget)[1] and sim.peak_bytes <= budget
    with pytest.raises(InfeasibleBudget) as info:
        dp(g, front[0][0] - 1)
    assert info.value.min_feasible_bytes == front[0][0]


def test_dp_keeps_nodes_where_that_is_cheaper():
    kept = 0
    for seed in SEEDS[:80]:
        g = sac_graph(seed)
        for peak, cost, _ in pareto_frontier(g):
            plan = dp(g, peak)
            kept += bool(plan.saved)
            assert plan.status == "optimal" and plan.bound == cost
            assert dp(g, peak, selective=False).bound >= cost
    assert kept >= 5


@pytest.mark.parametrize("seed", SEEDS[:40])
def test_dp_without_selective_is_the_plain_dp(seed):
    g = sac_graph(seed)
    plain = g.with_nodes(tuple(dataclasses.replace(nd, sac_op=-1, dispatch=()) for nd in g.nodes))
    off, unmarked = DPTable(g, max_front=None, selective=False), DPTable(plain, max_front=None)
    assert off.frontier() == unmarked.frontier()
    assert [off.plan_at(i)[0] for i in range(len(off.root.h))] == [unmarked.plan_at(i)[0]
                                                                     for i in range(len(off.root.h))]
    assert all(not off.plan_at(i).saved for i in range(len(off.root.h)))
    front = pareto_frontier(g, selective=False)
    assert [(p, c) for p, c, _ in front] == off.frontier()  # and it is the optimum without kept nodes


def _dp_digest() -> str:
    h = hashlib.sha256()
    graphs = [dataclasses.replace(random_graph(s, chain=s % 2 == 0), outputs=()) for s in range(60)]  # as above
    graphs += [synthetic.make(f, 40, seed=2) for f in ("hetero-chain", "residual", "unet", "random-dag", "transformer")]
    graphs += [synthetic.transformer(40, seed=3, spans=True), synthetic.repeated_blocks(4, 6, seed=5)]
    for g in graphs:
        t = DPTable(g, max_front=None)
        h.update(json.dumps([t.frontier(), [t.plan_at(i)[:3] for i in range(len(t.root.h))]]).encode())
    return h.hexdigest()[:16]


def test_dp_on_graphs_without_saveable_nodes_is_unchanged():
    # Recorded with main's dp before selective recompute (commit b99573e): every front and plan
    # of 67 graphs (chains, DAGs, transformers with spans, repeated blocks).
    assert _dp_digest() == "863a4b24137558bd"
