"""The chain structure of a DAG: articulation cuts, stages and common tensors.

Chen et al. and Rotor plan over a *chain*. A DAG in topological order is
reduced to one by cutting only where a single tensor crosses: a cut before
position ``c`` is an *articulation cut* when at most one tensor produced
before ``c`` is read at or after ``c``, ignoring *common* tensors, and that
tensor (the cut's *boundary tensor*) was produced after the previous cut. It
need not be the output of node ``c - 1``: in a transformer the attention
mask is computed between the embedding and block 0, yet the cut before
block 0 is valid (the embedding's output crosses it alone). The nodes
between two consecutive cuts form a *stage*.

NOTE [ Common tensors ]
    An attention mask, position ids or a shape computed once and read by every
    block crosses every cut of a transformer: without special treatment the
    graph has no articulation cut at all. A tensor is *common* when it does not
    require grad and is read by at least two nodes (ColossalAI's fx checkpoint
    solvers call these "common nodes"). Solvers built on stages treat common
    tensors as alive for the whole step (an upper bound on their real
    lifetime) and never put their producer in a region. Common tensors have
    no gradient, so gradients never cross a cut either.

    A tensor without grad whose producer and readers all fall in one stage
    crosses no cut, so it need not be common; as common it would keep its
    stage out of every region. At op granularity such tensors sit inside
    every block (a Llama layer's views of the rotary tables, read by the
    query's and the key's rotation), and ``dp`` found no region at all on a
    Llama-2-7B op graph (least feasible budget: store-all's 106 GiB, where
    the coarse graph had plans at 31 GiB). :func:`stages` makes them
    ordinary tensors of their stage again; the cuts stay the same.

NOTE [ Chains and forward holds ]
    A node of op ``holds`` (NOTE [ Forward holds ] in
    ``scheduler.tracing.forward_holds``) reads tensors the user's Python keeps
    past their last reader: ``x = block(x)`` keeps a block's input to the
    block's end, torchvision's ViT encoder keeps its input across every
    layer. Such a read crosses the cuts between the calls it outlives, and a
    graph with them had no articulation cut inside its encoder: ``dp``'s
    least feasible budget on a GPT became store-all's peak. The chain solvers
    therefore cut and plan on :func:`chain_view`, the graph without those
    reads (the nodes stay, positions and spans too), and check their answer
    on the graph itself (``simulate``): the holds only lengthen lifetimes in
    the forward, so a plan's peak on the view is a lower bound of its peak.
    No cut falls right before a hold: it stays in the stage of the node it
    follows (a stage of the hold alone would keep the next call, whose input
    was made before it, from starting a stage), and on the view a span ends
    after the holds that follow it; :func:`from_chain_view` takes them off
    the regions of an answer again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graphs import HOLDS_OP, Graph

from .terms import terms_of

__all__ = ["Stages", "stages", "common_tensors", "articulation_cuts", "chain_view", "from_chain_view"]


def chain_view(graph: Graph) -> Graph:
    """``graph`` without the reads of its ``holds`` nodes, each span taking in the holds right after it (NOTE
    [ Chains and forward holds ]); ``graph`` itself when it has none."""
    def make() -> Graph:
        holds = [nd.op == HOLDS_OP for nd in graph.nodes]
        if not any(holds):
            return graph
        nodes = tuple(dataclasses.replace(nd, inputs=(), saves_inputs=()) if h else nd
                      for nd, h in zip(graph.nodes, holds))
        spans = []
        for sp in graph.spans:
            last = sp.last
            while last + 1 < len(holds) and holds[last + 1]:
                last += 1
            spans.append(dataclasses.replace(sp, last=last))
        return dataclasses.replace(graph, nodes=nodes, spans=tuple(spans))
    return graph.cached("_chain_view", make)


def from_chain_view(graph: Graph, regions) -> tuple[tuple[int, int], ...]:  # noqa: ANN001
    """Regions of :func:`chain_view` (graph)'s spans as regions of ``graph``'s: without the holds they end in (a
    span of ``graph`` never ends in one: a hold goes after the spans ending at the node before it)."""
    out = []
    for a, b in regions:
        while b > a and graph.nodes[b].op == HOLDS_OP:
            b -= 1
        out.append((a, b))
    return tuple(out)


def common_tensors(graph: Graph) -> frozenset[int]:
    """Positions of common tensors (NOTE [ Common tensors ])."""
    return frozenset(i for i, nd in enumerate(graph.nodes)
                     if not nd.requires_grad and len(graph.succs[i]) >= 2)


def _cuts_and_boundaries(graph: Graph, common: frozenset[int]) -> tuple[list[int], list[int]]:
    """Cuts and, for each, the position of its boundary tensor (``c - 1`` when
    no tensor crosses)."""
    n = len(graph)
    last = terms_of(graph).last_reader
    # crossing[c]: non-common tensors j < c with last consumer >= c; xor of
    # their positions identifies the single one when the count is 1.
    delta = [0] * (n + 1)
    dx = [0] * (n + 1)
    for j in range(n):
        if j not in common and last[j] > j:
            delta[j + 1] += 1
            delta[last[j] + 1] -= 1
            dx[j + 1] ^= j
            dx[last[j] + 1] ^= j
    cuts, bounds = [], []
    open_, x = 0, 0
    prev = 0
    holds = [nd.op == HOLDS_OP for nd in graph.nodes]
    for c in range(1, n):
        open_ += delta[c]
        x ^= dx[c]
        if holds[c]:
            continue  # a hold stays with the node before it (NOTE [ Chains and forward holds ])
        if open_ == 0:
            cuts.append(c)
            bounds.append(c - 1)
            prev = c
        elif open_ == 1 and x >= prev:
            cuts.append(c)
            bounds.append(x)
            prev = c
        elif (open_ == 1 and cuts and x >= (cuts[-2] if len(cuts) > 1 else 0)
              and any(i in common or not graph.nodes[i].recomputable for i in range(prev, c))):
            # The tensor also crossed the previous cut, whose stage (an attention
            # mask, say) cannot be a region anyway: move that cut here.
            cuts[-1], bounds[-1] = c, x
            prev = c
    return cuts, bounds


def articulation_cuts(graph: Graph, common: frozenset[int] | None = None) -> list[int]:
    """Positions ``c`` (1..n-1) before which the graph can be cut.

    A cut is valid when at most one non-common tensor produced before ``c``
    is read at or after ``c``, and it was produced after the previous cut.
    On a chain every position is a cut.
    """
    if common is None:
        common = common_tensors(graph)
    return _cuts_and_boundaries(graph, common)[0]


@dataclass(frozen=True)
class Stages:
    """A graph seen as a chain of stages.

    Attributes:
        starts: first node of each stage (``starts[0] == 0``).
        ends: last node of each stage.
        common: positions of common tensors.
        regionable: per stage, whether its nodes may be put in a region (all
            recomputable, no common producer).
        boundary: per stage, the position of the tensor that crosses into it
            from the left (``starts[s] - 1`` when none does; -1 for stage 0).
    """

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    common: frozenset[int]
    regionable: tuple[bool, ...]
    boundary: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.starts)


def stages(graph: Graph) -> Stages:
    """Split ``graph`` at its articulation cuts (see the module docstring); computed once per graph object
    (``dp``, both of Chen's plans and the warm starts ask for it: 0.9 s on a 20,000-node chain)."""
    return graph.cached("_stages", lambda: _stages(graph))


def _stages(graph: Graph) -> Stages:
    common = common_tensors(graph)
    cuts, bounds = _cuts_and_boundaries(graph, common)
    starts = [0] + cuts
    ends = [s - 1 for s in starts[1:]] + [len(graph) - 1]
    # NOTE [ Common tensors ]: those that stay inside their stage are ordinary tensors of it.
    stage_of = [0] * len(graph)
    for k, (a, b) in enumerate(zip(starts, ends)):
        stage_of[a:b + 1] = [k] * (b - a + 1)
    local = {i for i in common if all(stage_of[c] == stage_of[i] for c in graph.succs[i])}
    if local:
        common = common - local
        if _cuts_and_boundaries(graph, common) != (cuts, bounds):  # cannot happen: they cross no cut
            common = common | local
    ok = []
    for a, b in zip(starts, ends):
        ok.append(all(graph.nodes[i].recomputable and i not in common for i in range(a, b + 1)))
    return Stages(tuple(starts), tuple(ends), common, tuple(ok), tuple([-1] + bounds))
