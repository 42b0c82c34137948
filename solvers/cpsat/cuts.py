"""Valid inequalities for ``ilp``'s CP-SAT model, from the store-all timeline.

NOTE [ Knapsack cuts from store-all ]
    At a forward step ``t``, or the backward step of node ``t``, a plan's
    live bytes are at least store-all's there minus, for each node ``c < t``
    in a region, ``free[c]``: its own buffers plus every tensor it saves (a
    region frees at most those; holding its inputs only adds). So
    ``sum_{c<t} free[c] x[c] >= storeall(t) - budget`` must hold. These
    knapsack rows give CP-SAT's LP a bound far from zero; their
    fractional-knapsack optimum (rounded up) is a proven lower bound on the
    recompute FLOPs.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterator

import numpy as np

from graphs import Graph

from ..model.simulate import simulate
from ..model.terms import terms_of

__all__ = ["memory_cuts", "iter_memory_cuts", "add_knapsack_rows", "region_literals"]

log = logging.getLogger(__name__)

#: Most rows added to a model (spread evenly over the order).
MAX_ROWS = 64


def memory_cuts(graph: Graph, budget_bytes: int) -> tuple[list[tuple[list[int], list[int], int]], int]:
    """The rows ``sum(free[c] x[c] for c in idx) >= need`` and the largest knapsack bound over them.

    Returns:
        ``(rows, bound)``: each row as ``(idx, free, need)``; ``bound`` is 0 when no row binds.
    """
    rows = list(iter_memory_cuts(graph, budget_bytes))
    return [(idx, free, need) for idx, free, need, _ in rows], max((lb for *_, lb in rows), default=0)


def iter_memory_cuts(graph: Graph, budget_bytes: int) -> Iterator[tuple[list[int], list[int], int, int]]:
    """:func:`memory_cuts` one row at a time, as ``(idx, free, need, bound)`` with the row's own knapsack bound
    (0 when it does not bind): a caller under a deadline stops between rows (each row is valid on its own;
    NOTE [ What follows a search ] in ``solvers.cpsat.model``). The simulation they start from runs first."""
    g = graph
    n = len(g)
    saves = terms_of(g).saves  # () for a node without grad
    free = [int(nd.saved_bytes) + sum(g.nodes[j].out_bytes for j in saves[c]) if nd.requires_grad else 0
            for c, nd in enumerate(g.nodes)]
    sim = simulate(g, None, record=True)
    need = [0] * (n + 1)  # need[L]: bytes the nodes c < L must free
    for (phase, i), live in zip(sim.steps, sim.live_bytes):
        need[i] = max(need[i], int(live) - int(budget_bytes))
    rows, best_before = [], 0
    for L in range(1, n + 1):  # a row is implied by a shorter prefix needing as much
        if need[L] > best_before:
            rows.append(L)
            best_before = need[L]
    if len(rows) > MAX_ROWS:
        rows = [rows[int(r)] for r in np.unique(np.linspace(0, len(rows) - 1, MAX_ROWS).round())]
    flops = [c if nd.recomputable else 0 for c, nd in zip(g.recompute_costs(), g.nodes)]
    ok = [nd.recomputable and free[c] > 0 for c, nd in enumerate(g.nodes)]
    for L in rows:
        idx = [c for c in range(L) if ok[c]]
        # Fractional knapsack: cheapest FLOPs per freed byte first.
        left, lb = need[L], 0.0
        for c in sorted(idx, key=lambda c: flops[c] / free[c]):
            take = min(1.0, left / free[c])
            lb += take * flops[c]
            left -= take * free[c]
            if left <= 0:
                break
        yield idx, [free[c] for c in idx], need[L], int(math.ceil(lb - 1e-9)) if left <= 0 else 0


def region_literals(x: list, y: list, regions) -> list:  # noqa: ANN001
    """The literals (of ``x``: node recomputed, ``y``: a region starts there) that are all false
    exactly on the plan whose regions are ``regions``: a no-good cut is their disjunction."""
    starts = {a for a, _ in regions}
    inside = {i for a, b in regions for i in range(a, b + 1)}
    lits = []
    for k in range(len(x)):
        lits.append(x[k].Not() if k in inside else x[k])
        lits.append(y[k].Not() if k in starts else y[k])
    return lits


def add_knapsack_rows(model: Any, budget_bytes: int) -> int:
    """The knapsack rows of :func:`memory_cuts` (NOTE [ Knapsack cuts from store-all ]) added to ``model`` (a
    ``CheckpointModel``); returns the bound they prove.

    Under a deadline the rows are made and added one at a time, each only while what the model's
    ``search_left()`` leaves is more than the longest row so far took (the first only with a pass over the
    graph left, for the simulation they start from): the rows added are each valid, and so is the bound over
    them (NOTE [ What follows a search ] in ``solvers.cpsat.model``)."""
    d = model.deadline
    if d is not None and model.search_left() < d.pass_estimate(len(model.graph)):
        log.info("ilp: no time left for the knapsack cuts")
        return 0
    bound, added, longest = 0, 0, 0.0
    rows = iter_memory_cuts(model.graph, budget_bytes)
    while True:
        started = d.clock() if d is not None else 0.0
        row = next(rows, None)
        if row is None:
            break
        idx, free, need, lb = row
        model.m.Add(sum(f * model.x[c] for c, f in zip(idx, free)) >= need)
        bound, added = max(bound, lb), added + 1
        if d is not None:
            longest = max(longest, d.clock() - started)
            if model.search_left() < longest:
                log.info("ilp: the knapsack cuts stopped at the time limit after %d rows", added)
                break
    return bound

