"""A finer graph never answers worse than the coarse graph it refines.

The issue behind it: on Llama-2-7B's op graph ``dp`` named a least feasible
budget of 93.1 GiB where the coarsened graph had a plan at 51.0 GiB. Every
plan of a coarse graph is a plan of a graph that refines it (its regions are
unions of the finer nodes, and the module calls are the same spans), so the
exact solver must find the least feasible budget and the optimal cost no
worse on the finer graph. Checked with ``ilp`` on small built-in models
traced once and grouped at op level, fold, and module depths 4, 3, 2; span-only
(as traced) and over every interval (``graph.unaligned()``).
"""

from __future__ import annotations

import itertools

import pytest

import solvers
from scheduler.models import build
from scheduler.tracing.tracer import capture
from solvers import InfeasibleBudget, store_all_peak
from solvers.ilp import frontier_program

MODELS = {
    "gpt": ("gpt", dict(layers=2, width=64, heads=2, seq=32, vocab=100)),
    "llama-tiny": ("hf:llama-tiny", dict(seq=64)),
    "resnet": ("resnet", dict(depth=26, width=8, image_size=32, batch=2)),
}
GRANULARITIES = ["op", "fold", 4, 3, 2]


@pytest.fixture(scope="module", params=list(MODELS))
def grouped(request):
    name, opts = MODELS[request.param]
    ex = build(name, **opts)
    traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op")
    return request.param, {gr: traced.regroup(gr).graph for gr in GRANULARITIES}


def _cover(g) -> list[frozenset[str]]:
    return [frozenset(nd.members or (nd.name,)) for nd in g.nodes]


def _refines(fine, coarse) -> bool:
    """Every node of ``fine`` lies inside one node of ``coarse`` (and ``fine`` is finer)."""
    owner = {m: i for i, ms in enumerate(_cover(coarse)) for m in ms}
    return len(fine) > len(coarse) and all(len({owner.get(m) for m in ms}) == 1 for ms in _cover(fine))


def _answers(g, budgets):
    """(least peak, [cost or None per budget]) by ilp (exact) over the plans that keep no node: the refinement
    argument is about regions, and ``least`` is the frontier program's over that set."""
    least = frontier_program(g).solve(None, objective="peak").objective
    costs = []
    for b in budgets:
        try:
            plan = solvers.solve(g, b, solver="ilp", time_limit_s=120, selective=False)
            assert plan.status == "optimal"
            costs.append(plan.recompute_cost)
        except InfeasibleBudget as exc:
            assert exc.min_feasible_bytes == least > b
            costs.append(None)
    return least, costs


@pytest.mark.parametrize("aligned", [True, False], ids=["spans", "any-interval"])
def test_finer_graphs_never_answer_worse(grouped, aligned):
    name, graphs = grouped
    graphs = {gr: (g if aligned else g.unaligned()) for gr, g in graphs.items()}
    op = graphs["op"]
    assert op.aligned == aligned and len(op) > len(graphs[2])
    top = store_all_peak(op).peak_bytes
    lows = [frontier_program(g).solve(None, objective="peak").objective for g in graphs.values()]
    lo = min(lows)
    budgets = sorted({lo + (top - lo) * t // 8 for t in range(9)} | set(lows))
    answers = {gr: _answers(g, budgets) for gr, g in graphs.items()}
    pairs = [(f, c) for f, c in itertools.permutations(GRANULARITIES, 2) if _refines(graphs[f], graphs[c])]
    assert {("op", c) for c in GRANULARITIES[1:] if len(graphs[c]) < len(op)} <= set(pairs)
    better = 0  # answers where the finer graph is strictly better: the test tells the graphs apart
    for fine, coarse in pairs:
        (lf, cf), (lc, cc) = answers[fine], answers[coarse]
        assert lf <= lc, (name, fine, coarse)
        better += lf < lc
        for b, x, y in zip(budgets, cf, cc):
            if y is not None:
                assert x is not None and x <= y, (name, fine, coarse, b, x, y)
            better += x is not None and (y is None or x < y)
    assert better > 0
