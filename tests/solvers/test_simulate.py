"""The execution model, checked against peaks computed by hand."""

import dataclasses

import pytest

from graphs import Graph, Node, Span, synthetic
from solvers import Plan, activation_budget_bytes, brute_force, pareto_frontier, simulate


def chain3() -> Graph:
    # a -> b -> c, 10 bytes each, each node saves its input (like linear layers).
    return Graph(nodes=(
        Node("a", out_bytes=10, fwd_flops=1),
        Node("b", inputs=("a",), out_bytes=10, fwd_flops=2),
        Node("c", inputs=("b",), out_bytes=10, fwd_flops=4),
    ))


def diamond() -> Graph:
    # a -> b, a -> c, (b, c) -> d; b and c save a, d saves b and c.
    return Graph(nodes=(
        Node("a", out_bytes=10, fwd_flops=1),
        Node("b", inputs=("a",), out_bytes=20, fwd_flops=2),
        Node("c", inputs=("a",), out_bytes=30, fwd_flops=4),
        Node("d", inputs=("b", "c"), out_bytes=5, fwd_flops=8),
    ))


# Timelines derived by hand from NOTE [ Execution model ]; see the comments. The
# seed gradient of c (grad c, the ``ones`` of ``loss.backward()``) is held by the
# caller until the backward returns, so it is in every backward step.
CHAIN3_CASES = {
    # fwd: a | a,b | a,b,c ; bwd c: +grad c(seed) +grad b ; bwd b: a,c + grad c + grad b + grad a ;
    # bwd a: c + grad c + grad a
    (): [10, 20, 30, 50, 50, 30],
    # b is recomputed from a (a is held by the region)
    ((1, 1),): [10, 20, 30, 50, 50, 50, 30],
    # region [a, b]: a dies in the forward (b is inside), b is kept by c.
    # bwd c: b,c + grad c + grad b = 40; recompute a (kept for b) = c + a + grad c + grad b = 40,
    # recompute b (a temporary) = 50; bwd b: c, a + grad c + grad b + grad a = 50; bwd a: c + grad c + grad a
    ((0, 1),): [10, 20, 20, 40, 40, 50, 50, 30],
    # one region over everything: the backward rematerialises it all.
    ((0, 2),): [10, 20, 20, 30, 40, 50, 50, 50, 30],
}


@pytest.mark.parametrize("regions", list(CHAIN3_CASES), ids=str)
def test_chain3_timeline_by_hand(regions):
    sim = simulate(chain3(), Plan(regions=regions))
    assert list(sim.live_bytes) == CHAIN3_CASES[regions]
    assert sim.peak_bytes == max(CHAIN3_CASES[regions])
    assert sim.recompute_flops == sum(chain3().nodes[i].fwd_flops for a, b in regions for i in range(a, b + 1))


DIAMOND_CASES = {
    # fwd 10, 30, 60, 65; bwd d: acts 65 + grad d 5 + grad b 20 + grad c 30 = 120;
    # bwd c: a, d + grad d (seed, held to the end) + grad b + grad a = 80 (grad c freed after);
    # bwd b: a, d + grad d + grad b + grad a + transient grad a = 60; bwd a: d + grad d + grad a = 20
    (): [10, 30, 60, 65, 120, 80, 60, 20],
    # region [b, d]: a held by the region; b, c die in the forward; recompute b (40), c (70), d (75, a temporary)
    ((1, 3),): [10, 30, 60, 65, 40, 70, 75, 120, 80, 60, 20],
    # region [a]: recomputing a adds a temporary copy of a (nothing in the region saves it)
    ((0, 0),): [10, 30, 60, 65, 120, 80, 60, 30, 20],
    # region [b, c], both read by d after it: a held by the region. Before the recompute a, d + grad d, b, c = 70;
    # recompute b (90); recompute c: b is an output of the running region, still referenced (90 + 30 = 120,
    # not 100); both are freed when the recompute ends; bwd c, b, a as in store-all.
    ((1, 2),): [10, 30, 60, 65, 120, 90, 120, 80, 60, 20],
}


@pytest.mark.parametrize("regions", list(DIAMOND_CASES), ids=str)
def test_diamond_timeline_by_hand(regions):
    sim = simulate(diamond(), Plan(regions=regions))
    assert list(sim.live_bytes) == DIAMOND_CASES[regions]
    assert sim.peak_bytes == 120
    assert sim.peak_node == "d" and sim.peak_phase == "backward"


def test_peak_breakdown_sums_to_peak():
    g = synthetic.transformer(40, seed=1)
    sim = simulate(g, Plan(regions=((2, 13), (14, 25))))
    assert sum(sim.breakdown.values()) == sim.peak_bytes
    assert sim.live_bytes[sim.peak_step] == sim.peak_bytes
    assert len(sim.steps) == len(sim.live_bytes)


def test_store_all_has_zero_recompute():
    for fam in synthetic.FAMILIES:
        sim = simulate(synthetic.make(fam, 30, seed=2))
        assert sim.recompute_flops == 0 and sim.recompute_ratio == 0.0


def test_chain16_four_regions_lower_one_region_not():
    g = synthetic.chain(16, out_bytes=10, flops=3)
    store_all = simulate(g)
    four = simulate(g, Plan(regions=[(4 * i, 4 * i + 3) for i in range(4)]))
    one = simulate(g, Plan(regions=[(0, 15)]))
    assert four.peak_bytes < store_all.peak_bytes
    assert one.peak_bytes >= store_all.peak_bytes  # its backward rematerialises everything
    assert one.recompute_flops == g.total_fwd_flops()  # exactly one extra forward


def test_requires_grad_false_nodes_save_nothing():
    g = Graph(nodes=(
        Node("mask", out_bytes=100, fwd_flops=0, requires_grad=False, saved_bytes=7),
        Node("x", out_bytes=10, fwd_flops=1),
        Node("y", inputs=("x", "mask"), out_bytes=10, fwd_flops=1, saves_inputs=("x", "mask")),
    ))
    sim = simulate(g)
    # the mask's own buffer is freed at once; the mask (saved by y) lives; no grad for the mask.
    assert sim.live_bytes[0] == 107 and sim.live_bytes[1] == 110
    # bwd y: mask, x, y + grad y + grad x (no grad for the mask)
    assert sim.live_bytes[3] == 100 + 10 + 10 + 10 + 10


def test_params_and_param_grads_are_counted():
    g = Graph(nodes=(
        Node("a", out_bytes=10, fwd_flops=1, param_bytes=40),
        Node("b", inputs=("a",), out_bytes=10, fwd_flops=1, param_bytes=60),
    ), param_bytes=100, input_bytes=3)
    sim = simulate(g)
    # forward: params + inputs + outputs; backward b adds its param grads (60), backward a its own (40)
    assert sim.live_bytes[:2] == (113, 123)
    assert sim.live_bytes[2] == 103 + 20 + 10 + 10 + 60  # a, b, grad b (seed), grad a, b's param grads
    assert sim.breakdown["params"] == 100 and sim.breakdown["inputs"] == 3


def test_workspace_is_transient():
    g = Graph(nodes=(Node("a", out_bytes=10, fwd_flops=1, workspace_bytes=1000),
                     Node("b", inputs=("a",), out_bytes=10, fwd_flops=1)))
    sim = simulate(g)
    assert sim.live_bytes[0] == 1010 and sim.live_bytes[1] == 20


def test_fraction_budget_admits_store_all():
    for fam in synthetic.FAMILIES:
        g = synthetic.make(fam, 20, seed=0)
        assert simulate(g).peak_bytes <= activation_budget_bytes(g, 1.0)
        assert activation_budget_bytes(g, 0.3) < activation_budget_bytes(g, 0.7)


@pytest.mark.parametrize("seed", range(6))
def test_larger_budget_never_raises_optimum_cost(seed):
    g = synthetic.hetero_chain(7, seed=seed) if seed % 2 else synthetic.random_dag(7, seed=seed)
    frontier = pareto_frontier(g)
    lo, hi = frontier[0][0], simulate(g).peak_bytes
    costs = []
    for k in range(11):
        budget = lo + (hi - lo) * k // 10
        plan = brute_force(g, budget, frontier=frontier)
        assert simulate(g, plan).peak_bytes <= budget
        assert simulate(g, plan).recompute_flops == plan.recompute_flops
        costs.append(plan.recompute_flops)
    assert costs == sorted(costs, reverse=True)
    assert costs[-1] == 0  # store-all fits its own peak


def test_brute_force_matches_exhaustive_minimum():
    g = synthetic.random_dag(6, seed=4)
    frontier = pareto_frontier(g)
    from solvers import enumerate_plans

    peaks = [simulate(g, Plan(regions=r), record=False).peak_bytes for r in enumerate_plans(g)]
    assert frontier[0][0] == min(peaks)
    assert len(peaks) == 233  # F(13): every interval plan of 6 nodes


@pytest.mark.parametrize("views,expected", [
    # cat hands its inputs views of its output's gradient: the 20-byte buffer lives until a's backward
    # (and the loss's 1-byte seed gradient to the end)
    (True, [10, 20, 40, 21, 42, 22, 22, 22]),
    # separate gradients: cat's backward allocates 10 + 10, each freed after its owner's backward
    (False, [10, 20, 40, 21, 42, 42, 22, 12]),
])
def test_cat_like_backward_with_view_gradients(views, expected):
    g = Graph(nodes=(
        Node("a", out_bytes=10, fwd_flops=1),
        Node("b", out_bytes=10, fwd_flops=1),
        Node("cat", inputs=("a", "b"), saves_inputs=(), out_bytes=20, fwd_flops=1, grad_views=views),
        Node("loss", inputs=("cat",), out_bytes=1, fwd_flops=1),
    ))
    assert list(simulate(g).live_bytes) == expected


def test_eager_extra_bytes_held_through_a_span_regions_recompute():
    """NOTE [ Execution model ], eager lifetimes in a recompute: a region equal to a span
    with ``extra_bytes`` holds them at every step of its recompute, nowhere else."""
    spans = (Span(0, 1, "blk", 7), Span(2, 2, "head"), Span(1, 1, "blk.b", 5))
    g = dataclasses.replace(chain3(), spans=spans)
    # Without extras (chain3): fwd a 10, b 20 (a dies inside the region), c 20 (b held by region [c],
    # c by the caller); bwd c's seed gradient 30; recompute c 40; bwd c (+ grad b) 40, then b is
    # released; recompute a (kept for b) 40, b 50; bwd b 50 (grad a); bwd a 30.
    # With them: "blk" adds 7 to its two recompute steps; "head" has none; "blk.b" is no region here.
    sim = simulate(g, Plan(regions=((0, 1), (2, 2))))
    assert [ph for ph, _ in sim.steps] == ["forward"] * 3 + ["recompute", "backward", "recompute", "recompute",
                                                             "backward", "backward"]
    assert list(sim.live_bytes) == [10, 20, 20, 40, 40, 47, 57, 50, 30]
    assert sim.peak_bytes == 57 and sim.peak_node == "b" and sim.peak_phase == "recompute"
    assert sim.breakdown["activations"] == 37  # c, a, b and the call's 7 bytes; grad c + grad b = 20
    # The one-node span "blk.b" as a region: its recompute step carries its 5 bytes (chain3: 50).
    assert list(simulate(g, Plan(regions=((1, 1),))).live_bytes) == [10, 20, 30, 50, 55, 50, 30]
    # Store-all and a graph without spans: no extra anywhere.
    assert simulate(g).live_bytes == simulate(chain3()).live_bytes
    assert list(simulate(g.unaligned(), Plan(regions=((0, 1), (2, 2)))).live_bytes) == [10, 20, 20, 40, 40, 40, 50,
                                                                                         50, 30]


# ----------------------------------------------------------------------- the user's loop
def _held_chain(loop: str) -> Graph:
    # a (10) -> b (20) -> c (30, the loss); nothing saves anything; b is what the model returns.
    return Graph(nodes=(
        Node("a", out_bytes=10, fwd_flops=1, saves_inputs=()),
        Node("b", inputs=("a",), out_bytes=20, fwd_flops=2, saves_inputs=()),
        Node("c", inputs=("b",), out_bytes=30, fwd_flops=4, saves_inputs=()),
    ), outputs=("b",), loop=loop)


def test_a_held_output_is_the_callers_to_the_end_of_the_step():
    # NOTE [ The user's loop ]: dropped, b dies after c reads it; held, it stays through the backward.
    held, dropped = simulate(_held_chain("held")), simulate(_held_chain("dropped"))
    assert held.steps == dropped.steps
    phases = [p for p, _ in held.steps]
    for phase, h, d in zip(phases, held.live_bytes, dropped.live_bytes):
        assert h - d == (20 if phase == "backward" else 0)
    assert simulate(dataclasses.replace(_held_chain("held"), outputs=())).live_bytes == dropped.live_bytes


def test_a_held_output_in_a_region_is_recomputed_beside_the_callers_copy():
    # Region [b]: the caller holds b's forward copy; the recompute makes its own (b is the region's
    # output until the recompute ends), so held, both are alive while it runs.
    plan = Plan(regions=((1, 1),))
    held, dropped = simulate(_held_chain("held"), plan), simulate(_held_chain("dropped"), plan)
    rec = [i for i, (p, _) in enumerate(held.steps) if p == "recompute"]
    assert len(rec) == 1 and held.live_bytes[rec[0]] - dropped.live_bytes[rec[0]] == 20
    assert held.recompute_flops == dropped.recompute_flops == 2
