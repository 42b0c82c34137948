"""The chain structure of a DAG: articulation cuts, stages and common tensors.

Chen et al. and Rotor plan over a *chain*. A DAG in topological order is
reduced to one by cutting only where a single tensor crosses: a cut before
position ``c`` is an *articulation cut* when every tensor produced before
``c`` and read at or after ``c`` is the output of node ``c - 1``, ignoring
*common* tensors. The nodes between two consecutive cuts form a *stage*.

NOTE [ Common tensors ]
    An attention mask, position ids or a shape computed once and read by every
    block crosses every cut of a transformer: without special treatment the
    graph has no articulation cut at all. A tensor is *common* when it does not
    require grad and is read by at least two nodes (ColossalAI's fx checkpoint
    solvers call these "common nodes"). Solvers built on stages treat common
    tensors as alive for the whole step (an upper bound on their real
    lifetime) and never put their producer in a region. Common tensors have
    no gradient, so gradients never cross a cut either.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphs import Graph

__all__ = ["Stages", "stages", "common_tensors", "articulation_cuts"]


def common_tensors(graph: Graph) -> frozenset[int]:
    """Positions of common tensors (NOTE [ Common tensors ])."""
    return frozenset(i for i, nd in enumerate(graph.nodes)
                     if not nd.requires_grad and len(graph.succs[i]) >= 2)


def articulation_cuts(graph: Graph, common: frozenset[int] | None = None) -> list[int]:
    """Positions ``c`` (1..n-1) before which the graph can be cut.

    A cut is valid when the non-common tensors produced before ``c`` and read
    at or after ``c`` are at most the output of node ``c - 1``. On a chain
    every position is a cut.
    """
    if common is None:
        common = common_tensors(graph)
    n = len(graph)
    last = [max(s) if s else -1 for s in graph.succs]
    # crossing[c]: non-common tensors j < c with last consumer >= c.
    delta = [0] * (n + 1)
    for j in range(n):
        if j not in common and last[j] > j:
            delta[j + 1] += 1
            delta[last[j] + 1] -= 1
    cuts = []
    open_ = 0
    for c in range(1, n):
        open_ += delta[c]
        own = 1 if (c - 1 not in common and last[c - 1] >= c) else 0
        if open_ - own == 0:
            cuts.append(c)
    return cuts


@dataclass(frozen=True)
class Stages:
    """A graph seen as a chain of stages.

    Attributes:
        starts: first node of each stage (``starts[0] == 0``).
        ends: last node of each stage.
        common: positions of common tensors.
        regionable: per stage, whether its nodes may be put in a region (all
            recomputable, no common producer).
    """

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    common: frozenset[int]
    regionable: tuple[bool, ...]

    def __len__(self) -> int:
        return len(self.starts)


def stages(graph: Graph) -> Stages:
    """Split ``graph`` at its articulation cuts (see the module docstring)."""
    common = common_tensors(graph)
    starts = [0] + articulation_cuts(graph, common)
    ends = [s - 1 for s in starts[1:]] + [len(graph) - 1]
    ok = []
    for a, b in zip(starts, ends):
        ok.append(all(graph.nodes[i].recomputable and i not in common for i in range(a, b + 1)))
    return Stages(tuple(starts), tuple(ends), common, tuple(ok))
