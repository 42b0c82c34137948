"""Repeated blocks composed by their own fronts (NOTE [ Composing repeated blocks ] in ``solvers.blocks.compose``).

On small seeded repeated-block graphs with spans the composed program equals
brute force over the span-only plans at every Pareto budget, and its least
peak equals brute force's; on larger ones it equals the program walking
every node, at every budget. Without spans regions cut blocks, so nothing is
composed and ``ilp`` still equals brute force.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

import solvers
from graphs import Graph, Node, Span, synthetic
from solvers import Plan, activation_budget_bytes, pareto_frontier, simulate, store_all_peak
from solvers.brute_force import count_selective
from solvers.blocks.compose import find_chain, period
from solvers.frontier.program import FrontierDP


def _small_cases():
    out = []
    seed = 0
    while len(out) < 40:
        rng = random.Random(seed)
        g = synthetic.repeated_blocks(rng.choice([3, 4]), rng.choice([1, 2, 3]), seed=seed, common=rng.choice([1, 2]))
        if len(g) <= 13:
            out.append((seed, g))
        seed += 1
    return out


SMALL = _small_cases()


def _aligned(g: Graph, regions) -> bool:
    return all(tuple(r) in g.allowed_regions() for r in regions)


def test_small_cases_have_chains():
    assert len(UNALIGNED) >= 8
    composed = sum(FrontierDP(g, max_width=64).chain is not None for _, g in SMALL)
    assert composed >= 30


@pytest.mark.parametrize("seed,graph", SMALL, ids=[f"seed{s}-{len(g)}n" for s, g in SMALL])
def test_composition_equals_brute_force(seed, graph):
    frontier = pareto_frontier(graph)
    program = FrontierDP(graph, max_width=64)
    for peak, opt, _ in frontier:
        res = program.solve(peak)
        assert res is not None and res.objective == opt
        assert _aligned(graph, res.regions)
        sim = simulate(graph, Plan(regions=res.regions), record=False)
        assert sim.peak_bytes <= peak and sim.recompute_flops == opt
        assert res.blocks == (len(program.chain.blocks) if program.chain is not None else 0)
    least = program.solve(None, objective="peak")
    assert least.objective == frontier[0][0]
    assert simulate(graph, Plan(regions=least.regions), record=False).peak_bytes == frontier[0][0]
    assert program.solve(frontier[0][0] - 1) is None


UNALIGNED = [(s, g) for s, g in SMALL if len(g) <= 10][:10]  # brute force over every interval plan


@pytest.mark.parametrize("seed,graph", UNALIGNED, ids=[f"seed{s}-{len(g)}n" for s, g in UNALIGNED])
def test_without_spans_nothing_is_composed_and_ilp_equals_brute_force(seed, graph):
    g = graph.unaligned()
    assert FrontierDP(g, max_width=64).chain is None  # any interval may cut a block
    frontier = pareto_frontier(g)
    for peak, opt, _ in frontier[:: max(1, len(frontier) // 5)]:
        plan = solvers.solve(g, peak, solver="ilp", method="frontier")
        assert plan.recompute_flops == opt and plan.status == "optimal" and "blocks_composed" not in plan.findings


LARGE = [(seed, synthetic.repeated_blocks(8, 4 + seed % 7, seed=seed, common=1 + seed % 3, cut=seed % 4 == 0))
         for seed in range(24)]


@pytest.mark.parametrize("seed,graph", LARGE, ids=[f"seed{s}-{len(g)}n" for s, g in LARGE])
def test_composition_equals_walking_every_node(seed, graph):
    composed = FrontierDP(graph, max_width=64)
    walked = FrontierDP(graph, max_width=64, blocks=False)
    least = walked.solve(None, objective="peak").objective
    assert composed.solve(None, objective="peak").objective == least
    top = solvers.store_all_peak(graph).peak_bytes
    for t in range(12):
        budget = least + (top - least) * t // 11
        a, b = composed.solve(budget), walked.solve(budget)
        assert a.objective == b.objective
        sim = simulate(graph, Plan(regions=a.regions), record=False)
        assert sim.peak_bytes <= budget and sim.recompute_flops == a.objective and _aligned(graph, a.regions)


def test_most_large_cases_compose_and_cut_blocks_are_walked():
    chains = [FrontierDP(g, max_width=64).chain for _, g in LARGE]
    assert sum(c is not None for c in chains) >= 18
    for (seed, g), chain in zip(LARGE, chains):
        if chain is None:
            continue
        across = [(sp.first, sp.last) for sp in g.spans if sp.module == "across"]
        for a, b in across:
            assert not any(blk.first < a <= blk.last or blk.first <= b < blk.last for blk in chain.blocks)


def _renamed(g: Graph, seed: int) -> Graph:
    rng = random.Random(seed)
    names = {nd.name: f"op{rng.randrange(10**9)}_{i}" for i, nd in enumerate(g.nodes)}
    nodes = [dataclasses.replace(nd, name=names[nd.name], inputs=tuple(names[x] for x in nd.inputs),
                                 saves_inputs=tuple(names[x] for x in nd.saves_inputs), module="")
             for nd in g.nodes]
    spans = [Span(sp.first, sp.last, f"m{rng.randrange(10**6)}") for sp in g.spans]
    return dataclasses.replace(g, nodes=tuple(nodes), spans=tuple(spans))


def test_blocks_are_found_by_structure_not_by_name():
    g = synthetic.transformer(101, spans=True)
    chain = FrontierDP(g).chain
    assert chain is not None and [(b.first, b.last) for b in chain.blocks] == [(2 + 12 * i, 13 + 12 * i) for i in range(7)]
    other = FrontierDP(_renamed(g, 1)).chain
    assert [(b.first, b.last) for b in other.blocks] == [(b.first, b.last) for b in chain.blocks]


def test_period_of_a_repeated_sequence():
    import numpy as np

    h = np.array([9, 8] + [1, 2, 3] * 5 + [7])
    assert period(h) == (3, 2, 15)
    assert period(np.arange(10)) is None


def test_ilp_composes_blocks_and_proves_optimality():
    g = synthetic.repeated_blocks(12, 9, seed=3, common=2)
    for f in (0.3, 0.6):
        budget = activation_budget_bytes(g, f)
        plan = solvers.solve(g, budget, solver="ilp")
        walked = solvers.solve(g, budget, solver="ilp", blocks=False)
        assert plan.status == walked.status == "optimal" and plan.findings["blocks_composed"] >= 2
        assert plan.recompute_flops == walked.recompute_flops and "blocks_composed" not in walked.findings


def test_block_offsets_follow_parameter_gradients():
    # Heavier parameters make the backward of earlier blocks fuller: the offsets grow toward the input.
    g = synthetic.repeated_blocks(6, 5, seed=11)
    nodes = [dataclasses.replace(nd, param_bytes=nd.param_bytes + 1000) if nd.name.startswith("b") else nd
             for nd in g.nodes]
    g = dataclasses.replace(g, nodes=tuple(nodes), param_bytes=g.param_bytes + 1000 * len(nodes))
    chain = find_chain(FrontierDP(g, blocks=False))
    offs = [b.off for b in chain.blocks]
    assert offs == sorted(offs, reverse=True) and offs[0] > offs[-1]
    least = FrontierDP(g, blocks=False).solve(None, objective="peak").objective
    budget = (int(least) + store_all_peak(g).peak_bytes) // 2  # between the floor and store-all
    assert FrontierDP(g).solve(budget).objective == FrontierDP(g, blocks=False).solve(budget).objective


@pytest.mark.parametrize("seed", range(6))
def test_blocks_with_held_outputs_compose_as_walked(seed):
    # NOTE [ The user's loop ]: a tensor every block returns (a cache) is held in every copy, and one more
    # in a single block only (that copy is no longer identical): the fronts still equal the walk.
    g = synthetic.repeated_blocks(8, 5 + seed % 3, seed=seed, common=1 + seed % 2)
    held = [nd.name for nd in g.nodes if nd.name.endswith(".1")] + [f"b{2 + seed % 3}.2"]
    g = dataclasses.replace(g, outputs=tuple(held), loop="held")
    composed, walked = FrontierDP(g, max_width=64), FrontierDP(g, max_width=64, blocks=False)
    assert composed.chain is not None and len(composed.chain.blocks) >= 3
    least = walked.solve(None, objective="peak").objective
    assert composed.solve(None, objective="peak").objective == least
    top = store_all_peak(g).peak_bytes
    assert least > FrontierDP(dataclasses.replace(g, loop="dropped"), max_width=64).solve(None, objective="peak").objective
    for t in range(8):
        budget = least + (top - least) * t // 7
        a, b = composed.solve(budget), walked.solve(budget)
        assert a.objective == b.objective
        sim = simulate(g, Plan(regions=a.regions), record=False)
        assert sim.peak_bytes <= budget and sim.recompute_flops == a.objective


# ------------------------------------------------ kept nodes inside composed blocks
def _small_kept_cases():
    out, seed = [], 0
    while len(out) < 24:
        rng = random.Random(500 + seed)
        g = synthetic.repeated_blocks(rng.choice([3, 4]), rng.choice([2, 3]), seed=seed, common=rng.choice([1, 2]),
                                      saveable=0.7)
        if len(g) <= 13 and solvers.ilp.keepable(g) and count_selective(g) <= 3000:
            out.append((seed, g))
        seed += 1
    return out


SMALL_KEPT = _small_kept_cases()


@pytest.mark.parametrize("seed,graph", SMALL_KEPT, ids=[f"seed{s}-{len(g)}n" for s, g in SMALL_KEPT])
def test_composition_with_kept_nodes_equals_brute_force(seed, graph):
    """NOTE [ Kept nodes in the frontier DP ]: a block's own front tries every menu entry, as walking does."""
    frontier = pareto_frontier(graph)  # over regions and kept nodes
    program = FrontierDP(graph, max_width=64, selective=True)
    for peak, opt, _ in frontier:
        res = program.solve(peak)
        assert res is not None and res.objective == opt
        sim = simulate(graph, Plan(regions=res.regions, saved=res.saved), record=False)
        assert sim.peak_bytes <= peak and sim.recompute_cost == opt and _aligned(graph, res.regions)
    assert program.solve(None, objective="peak").objective == frontier[0][0]


def test_kept_cases_compose_and_keep_nodes_inside_blocks():
    chains = [FrontierDP(g, max_width=64, selective=True).chain for _, g in SMALL_KEPT]
    assert sum(c is not None for c in chains) >= 12
    inside = 0
    for (_, g), chain in zip(SMALL_KEPT, chains):
        if chain is None:
            continue
        program = FrontierDP(g, max_width=64, selective=True)
        for peak, _, _ in pareto_frontier(g):
            res = program.solve(peak)
            inside += any(b.first <= k <= b.last for k in res.saved for b in chain.blocks)
    assert inside >= 10  # the composed fronts' own kept nodes are read back


LARGE_KEPT = [(seed, synthetic.repeated_blocks(8, 4 + seed % 5, seed=seed, common=1 + seed % 2, cut=seed % 4 == 0,
                                               saveable=0.6)) for seed in range(10)]


@pytest.mark.parametrize("seed,graph", LARGE_KEPT, ids=[f"seed{s}-{len(g)}n" for s, g in LARGE_KEPT])
def test_composition_with_kept_nodes_equals_walking_every_node(seed, graph):
    composed = FrontierDP(graph, max_width=64, selective=True)
    walked = FrontierDP(graph, max_width=64, blocks=False, selective=True)
    least = walked.solve(None, objective="peak").objective
    assert composed.solve(None, objective="peak").objective == least
    top = solvers.store_all_peak(graph).peak_bytes
    for t in range(8):
        budget = least + (top - least) * t // 7
        a, b = composed.solve(budget), walked.solve(budget)
        assert a.objective == b.objective
        sim = simulate(graph, Plan(regions=a.regions, saved=a.saved), record=False)
        assert sim.peak_bytes <= budget and sim.recompute_cost == a.objective and _aligned(graph, a.regions)
