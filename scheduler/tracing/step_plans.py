"""The plans a trace times in the model's own step (NOTE [ Recompute timed in the step ] in
``scheduler.tracing.recompute_scale``): its blocks checkpointed, one region over them, a node kept in each,
the head's loop alone."""

from __future__ import annotations

from typing import Any, Sequence

from graphs import CkptError, Graph

__all__ = ["MAX_COVER", "MIN_COVERED", "block_plan", "cover_plan", "head_plans"]

#: The most the cover's recompute may be, over the blocks' (more: a region's call is not measured against it).
MAX_COVER = 2.0
#: The fewest blocks a cover is timed around: a region's call is read off the difference of ``n`` calls and one,
#: so a step's noise reaches it over ``n - 1`` (ConvNeXt's 4 blocks read 0.7 and 2.6 ms in two traces).
MIN_COVERED = 8


def block_plan(graph: Graph, kept: bool = False) -> Any:
    """The plan checkpointing each repeated block of ``graph`` (``per-module``'s), or None without blocks; with
    ``kept``, keeping in each block the node its menu ranks first (``solvers.model.selective.variants``), or None
    where no block has one."""
    from solvers import Plan
    from solvers.baselines import NoModulePaths, block_spans

    try:
        try:
            regions = block_spans(graph)
        except NoModulePaths:
            regions = _numbered_spans(graph)
        if not regions:
            return None
        return _keeping(graph, regions) if kept else Plan.from_regions(graph, regions)
    except (NoModulePaths, CkptError):
        return None


def _keeping(graph: Graph, regions: Sequence[tuple[int, int]]) -> Any:
    """``regions`` keeping in each the node its menu ranks first (``solvers.model.selective.variants``), or None
    where no region has one."""
    from solvers import Plan
    from solvers.model.selective import variants

    saved = sorted(k for a, b in regions for k in (variants(graph, a, b) + [()])[1][:1])
    return Plan.from_regions(graph, regions, saved=tuple(saved)) if saved else None


def cover_plan(graph: Graph, plan: Any) -> Any:
    """One region over the shortest usable span around ``plan``'s regions (the blocks'), or None where there are
    fewer than :data:`MIN_COVERED`, no span holds them all, or its recompute is over :data:`MAX_COVER` times
    theirs."""
    from solvers import Plan, simulate
    from solvers.model.spans import SpanIndex

    if plan is None or len(plan.regions) < MIN_COVERED:
        return None
    span = SpanIndex(graph).cover_of(plan.regions[0][0], plan.regions[-1][1])
    if span is None:
        return None
    try:
        whole = Plan.from_regions(graph, [span])
    except CkptError:
        return None
    ours = simulate(graph, plan, record=False).recompute_time_s or 0.0
    return whole if ours > 0 and (simulate(graph, whole, record=False).recompute_time_s or 0.0) <= MAX_COVER * ours \
        else None


def _numbered_spans(graph: Graph) -> list[tuple[int, int]]:
    """The spans of the most frequent family of numbered submodules of one parent whose names do not end in an
    index of their own (torchvision DenseNet's ``features.denseblock3.denselayer1`` to ``denselayer24``), the
    recomputable ones, left to right without overlap; empty where no family has two."""
    from collections import Counter

    from solvers.model.spans import SpanIndex

    def family(path: str) -> tuple[str, str] | None:
        parent, _, leaf = path.rpartition(".")
        stem = leaf.rstrip("0123456789")
        return (parent, stem) if stem and stem != leaf and stem.isidentifier() else None

    counts = Counter(f for f in (family(sp.module) for sp in graph.spans) if f is not None)
    if not counts or counts.most_common(1)[0][1] < 2:
        return []
    best = counts.most_common(1)[0][0]
    usable = set(SpanIndex(graph).spans)
    regions: list[tuple[int, int]] = []
    for sp in sorted(graph.spans, key=lambda sp: (sp.first, sp.last)):
        if family(sp.module) == best and (sp.first, sp.last) in usable and (not regions or sp.first > regions[-1][1]):
            regions.append((sp.first, sp.last))
    return regions


def head_plans(graph: Graph) -> tuple[str, dict[str, Any]] | None:
    """``(call, {k: plan})``: for each count ``k`` of ``graph``'s head and loss that the trace timed at its shape
    (``chunk_times``: 1 is a fused head whole), the plan running the head and loss in ``k`` chunks and nothing
    else; None where no count was timed."""
    from solvers import Plan
    from solvers.model.chunks import LOSS_SUFFIX, ChunkError, find_tail
    from solvers.model.overheads import chunk_times

    try:
        tail = find_tail(graph)
        name = tail.head + LOSS_SUFFIX
        counts = sorted(chunk_times(graph).get(name, {}))
        if not counts:
            return None
        return name, {str(k): Plan.from_regions(graph, [], chunks=((tail.first, len(graph) - 1, k),))
                      for k in counts}
    except (ChunkError, CkptError):
        return None
