"""Baselines users know: store everything, and k equal regions.

* ``store-all``: no checkpointing at all.
* ``uniform``: the node order cut into ``k`` equal segments, every segment
  but the last checkpointed, which is what ``checkpoint_sequential(fns, k)``
  does. Without ``k``, the cheapest ``k`` that fits is chosen.
* ``per-module``: one region per repeated block (``h.3``, ``layers.7``,
  ``encoder.layer.2``), what Hugging Face's ``gradient_checkpointing_enable()``
  does.

None is proven optimal; the candidates do not depend on the budget, so a
bigger budget never costs more.
"""

from __future__ import annotations

from collections import Counter

from graphs import CkptError, Graph

from .errors import InfeasibleBudget
from .plan import Plan, Status
from .registry import register
from .simulate import simulate

__all__ = ["store_all", "uniform", "uniform_regions", "per_module", "block_regions", "NoModulePaths"]


@register("store-all")
def store_all(graph: Graph, budget_bytes: int) -> Plan:
    """No regions. Raises :class:`InfeasibleBudget` if store-all does not fit."""
    sim = simulate(graph, None, record=False)
    if sim.peak_bytes > budget_bytes:
        raise InfeasibleBudget(budget_bytes, sim.peak_bytes, solver="store-all", best_regions=())
    return Plan(regions=(), status=Status.OPTIMAL if sim.recompute_flops == 0 else Status.FEASIBLE)


def uniform_regions(graph: Graph, k: int) -> list[tuple[int, int]]:
    """``k`` near-equal segments of the node order; all but the last become regions.

    Segments whose nodes are not all recomputable are left out.
    """
    n = len(graph)
    k = max(1, min(k, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    regions = []
    for s in range(k - 1):
        a, b = bounds[s], bounds[s + 1] - 1
        if a <= b and all(graph.nodes[i].recomputable for i in range(a, b + 1)):
            regions.append((a, b))
    return regions


@register("uniform")
def uniform(graph: Graph, budget_bytes: int, k: int | None = None) -> Plan:
    """``checkpoint_sequential``-style plan with ``k`` segments.

    Args:
        k: number of segments; ``None`` tries every ``k`` from 1 to n and
            keeps the cheapest plan that fits.
    """
    candidates = [k] if k is not None else range(1, len(graph) + 1)
    best = None
    min_peak, least = None, ()
    for kk in candidates:
        plan = Plan(regions=tuple(uniform_regions(graph, kk)))
        sim = simulate(graph, plan, record=False)
        if min_peak is None or sim.peak_bytes < min_peak:
            min_peak, least = sim.peak_bytes, plan.regions
        if sim.peak_bytes <= budget_bytes:
            key = (sim.recompute_flops, sim.peak_bytes)
            if best is None or key < best[0]:
                best = (key, plan, kk)
    if best is None:
        raise InfeasibleBudget(budget_bytes, int(min_peak), solver="uniform", best_regions=least)
    _, plan, kk = best
    return Plan(regions=plan.regions, status=Status.FEASIBLE, options={"k": kk})


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
    ``<path>.<int>`` family), one region each.

    Raises:
        NoModulePaths: no node has a module path with a block index.
    """
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
    return Plan(regions=regions, status=Status.FEASIBLE, options={"blocks": len(regions)})
