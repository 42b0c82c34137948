"""The CP-SAT model's generator-state terms (NOTE [ RNG state per region ] in ``solvers.model.terms``)."""

from __future__ import annotations

from typing import Any

__all__ = ["rng_counts"]


def rng_counts(model: Any) -> tuple[int, list, list]:
    """``(rng, rs, sr)`` for a :class:`~solvers.cpsat.model.CheckpointModel`.

    A region with a stochastic node stores the generator state (``rng``
    bytes) from its first forward step to its first node's backward, so at
    step ``k`` every such region started at or before ``k`` holds it:
    ``rs[k]`` of them. Its own recompute holds a second copy (``sr[k]``: k's
    region is stochastic). The booleans are only forced up: they only add
    bytes, so the solver keeps them at their least value. ``rng`` is 0 (and
    the lists hold zeros) when the graph draws no random numbers.
    """
    g, m, x, cont = model.graph, model.m, model.x, model.cont
    nodes = g.nodes
    n = len(nodes)
    rng = int(g.rng_state_bytes) if any(nd.stochastic for nd in nodes) else 0
    rs: list = [0] * n
    sr: list = [0] * n
    if not rng:
        return 0, rs, sr
    down: list = [None] * (n + 1)  # k lies in a region with a stochastic node at or after k
    for k in range(n - 1, -1, -1):
        d = m.NewBoolVar(f"rngd{k}")
        if nodes[k].stochastic:
            m.AddImplication(x[k], d)
        if k + 1 < n:
            m.AddBoolOr([cont[k + 1].Not(), down[k + 1].Not(), d])
        down[k] = d
    for k in range(n):
        st = m.NewBoolVar(f"rngs{k}")  # a stochastic region starts at k
        m.AddBoolOr([model.y[k].Not(), down[k].Not(), st])
        r = m.NewBoolVar(f"rngr{k}")  # k's region is stochastic
        m.AddImplication(st, r)
        if k:
            m.AddBoolOr([cont[k].Not(), sr[k - 1].Not(), r])
        sr[k] = r
        v = m.NewIntVar(0, n, f"rngn{k}")
        m.Add(v == (rs[k - 1] if k else 0) + st)
        rs[k] = v
    return rng, rs, sr
