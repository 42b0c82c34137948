"""Baselines users know: store everything, and k equal regions.

* ``store-all``: no checkpointing at all.
* ``uniform``: the node order cut into ``k`` equal segments, every segment
  but the last checkpointed, which is what ``checkpoint_sequential(fns, k)``
  does. Without ``k``, the cheapest ``k`` that fits is chosen.
* ``per-module``: one region per repeated block (``h.3``, ``layers.7``,
  ``encoder.layer.2``), what Hugging Face's ``gradient_checkpointing_enable()``
  does.

On a graph with spans (NOTE [ Module-aligned regions ] in ``graphs.graph``)
every region is a span: ``uniform`` snaps its segments onto spans and
``per-module`` takes the block spans themselves.

None is proven optimal; the candidates do not depend on the budget, so a
bigger budget never costs more.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from graphs import CkptError, Graph

from .errors import InfeasibleBudget
from .options import Option
from .model.plan import Plan, Status
from .registry import register
from .model.simulate import simulate
from .model.spans import SpanIndex

__all__ = ["store_all", "uniform", "uniform_regions", "per_module", "block_regions", "block_spans", "NoModulePaths"]


@register("store-all")
def store_all(graph: Graph, budget_bytes: int) -> Plan:
    """No regions. Raises :class:`InfeasibleBudget` if store-all does not fit."""
    sim = simulate(graph, None, record=False)
    if sim.peak_bytes > budget_bytes:
        raise InfeasibleBudget(budget_bytes, sim.peak_bytes, solver="store-all", best_regions=())
    return Plan(regions=(), status=Status.OPTIMAL if sim.recompute_cost == 0 else Status.FEASIBLE)


def _segments(n: int, k: int) -> list[tuple[int, int]]:
    """``k`` near-equal segments of ``n`` nodes, all but the last."""
    k = max(1, min(k, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(bounds[s], bounds[s + 1] - 1) for s in range(k - 1) if bounds[s] <= bounds[s + 1] - 1]


def uniform_regions(graph: Graph, k: int) -> list[tuple[int, int]]:
    """``k`` near-equal segments of the node order; all but the last become regions.

    Segments whose nodes are not all recomputable are left out.
    """
    return [(a, b) for a, b in _segments(len(graph), k) if all(graph.nodes[i].recomputable for i in range(a, b + 1))]


def _uniform_candidates(graph: Graph, candidates) -> Iterator[tuple[int, tuple[tuple[int, int], ...]]]:
    """``(k, regions)`` for every ``k``; on a graph with spans each segment
    plan snapped onto spans (its tiling and its cover, ``SpanIndex.snap``),
    every distinct plan once."""
    if not graph.spans:
        for kk in candidates:
            yield kk, tuple(uniform_regions(graph, kk))
        return
    index, seen = SpanIndex(graph), set()
    for kk in candidates:
        for regions in index.snap(_segments(len(graph), kk)):
            if regions not in seen:
                seen.add(regions)
                yield kk, regions


@register("uniform", options=(Option("k", int, "segments; None tries every k from 1 to n and keeps the cheapest "
                                            "plan that fits", minimum=1, none_ok=True),))
def uniform(graph: Graph, budget_bytes: int, k: int | None = None) -> Plan:
    """``checkpoint_sequential``-style plan with ``k`` segments.

    On a graph with spans (NOTE [ Module-aligned regions ] in
    ``graphs.graph``) each segment becomes the longest spans inside it, or
    the shortest span around it: both plans are candidates.

    Args:
        k: number of segments; ``None`` tries every ``k`` from 1 to n and
            keeps the cheapest plan that fits.
    """
    candidates = [k] if k is not None else range(1, len(graph) + 1)
    best = None
    min_peak, least = None, ()
    for kk, regions in _uniform_candidates(graph, candidates):
        plan = Plan(regions=regions)
        sim = simulate(graph, plan, record=False)
        if min_peak is None or sim.peak_bytes < min_peak:
            min_peak, least = sim.peak_bytes, plan.regions
        if sim.peak_bytes <= budget_bytes:
            key = (sim.total_cost, sim.peak_bytes)  # NOTE [ Plan overheads ]
            if best is None or key < best[0]:
                best = (key, plan, kk)
    if best is None:
        raise InfeasibleBudget(budget_bytes, int(min_peak), solver="uniform", best_regions=least)
    _, plan, kk = best
    return Plan(regions=plan.regions, status=Status.FEASIBLE, findings={"k": kk})


class NoModulePaths(CkptError, ValueError):
    """The graph carries no repeated-block module paths for ``per-module``."""

def _block_prefix(path: str) -> str | None:
    """``"transformer.h.3.attn"`` -> ``"transformer.h.3"``; None without an index."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit() and i > 0:
            return ".".join(parts[: i + 1])
    return None

def block_regions(graph: Graph) -> list[tuple[int, int]]:
    """Consecutive runs of nodes inside one repeated block (the most frequent
    ``<path>.<int>`` family), one region each; on a graph with spans, the
    spans of that family's calls (:func:`block_spans`).

    Raises:
        NoModulePaths: no node (no span) has a module path with a block index.
    """
    if graph.spans:
        return block_spans(graph)
    prefixes = [_block_prefix(nd.module) if nd.module else None for nd in graph.nodes]
    families = Counter(p.rsplit(".", 1)[0] for p in prefixes if p)
    if not families:
        raise NoModulePaths(
            f"graph {graph.name!r} has no module paths with a block index (like 'h.3' or 'layers.7'); "
            "per-module needs a traced graph (ckpt trace) — use 'dp', 'chen' or 'uniform' instead")
    family = families.most_common(1)[0][0]
    regions: list[tuple[int, int]] = []
    current, start = None, 0
    for i, p in enumerate(prefixes + [None]):
        key = p if p and p.rsplit(".", 1)[0] == family else None
        if key != current:
            if current is not None:
                regions.append((start, i - 1))
            current, start = key, i
    return [(a, b) for a, b in regions if all(graph.nodes[i].recomputable for i in range(a, b + 1))]

def block_spans(graph: Graph) -> list[tuple[int, int]]:
    """The spans whose module is a block ``<path>.<int>`` of the most frequent
    such family (``h.3``, not ``h.3.attn``; ``seq[2:5]`` is no block): what
    ``gradient_checkpointing_enable()`` checkpoints. Spans with a node that
    is not recomputable are left out, and, left to right, one that overlaps
    a block kept before it.

    Raises:
        NoModulePaths: no span is such a block.
    """
    blocks = [(sp.first, sp.last, sp.module.rsplit(".", 1)[0]) for sp in graph.spans
              if _block_prefix(sp.module) == sp.module]
    families = Counter(fam for _, _, fam in blocks)
    if not families:
        raise NoModulePaths(
            f"graph {graph.name!r} has no span whose module is a repeated block (like 'h.3' or 'layers.7'); "
            "per-module checkpoints such blocks — use 'dp', 'ilp', 'chen' or 'uniform' instead")
    family = families.most_common(1)[0][0]
    usable = set(SpanIndex(graph).spans)
    regions: list[tuple[int, int]] = []
    for a, b, fam in sorted(blocks):
        if fam == family and (a, b) in usable and (not regions or a > regions[-1][1]):
            regions.append((a, b))
    return regions


@register("per-module")
def per_module(graph: Graph, budget_bytes: int) -> Plan:
    """One region per repeated block, like ``gradient_checkpointing_enable()``.

    Raises:
        NoModulePaths: the graph has no block module paths.
        InfeasibleBudget: the plan does not fit; carries its peak.
    """
    regions = tuple(block_regions(graph))
    sim = simulate(graph, Plan(regions=regions), record=False)
    if sim.peak_bytes > budget_bytes:
        raise InfeasibleBudget(budget_bytes, sim.peak_bytes, solver="per-module", best_regions=regions)
    return Plan(regions=regions, status=Status.FEASIBLE, findings={"blocks": len(regions)})
