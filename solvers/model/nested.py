"""Nested regions: what a nested plan is (a region whose recompute runs with inner regions checkpointed), and
which inner regions a region may nest (its menu). Solving over nestings is ``solvers.menus.nested``.

NOTE [ Nested regions ]
    A plan may nest regions one level deep (depth 2): ``Plan.inner`` lists
    regions that lie strictly inside one of ``Plan.regions`` (its *outer*
    region). Applied, the outer call runs under a non-reentrant checkpoint and
    the inner calls, which it makes, under checkpoints of their own
    (``torch.utils.checkpoint`` nests; Chen et al.'s recursive schedule, the
    revolve / Rotor family). ``simulate`` walks it as torch runs it
    (``_NestedWalk``); every other step is NOTE [ Execution model ]:

    * forward: the outer region is a region like any other (it keeps its
      inputs only). The inner checkpoints save their inputs through the
      outer's pack hook, so they keep nothing either; a stochastic inner
      region stores its generator state (NOTE [ RNG state per region ]) from
      its first forward step to the backward of its first node;
    * when the backward reaches the outer's last node, its recompute runs the
      outer's nodes from its inputs; a node outside every inner region keeps
      what it saves (as in a one-level recompute), a node inside an inner
      region keeps nothing (own buffers freed at once, its output freed after
      its last consumer), and each inner region's inputs made by the
      recompute are kept (the outer's recompute stores what the inner
      checkpoint saves) until that inner region's own recompute ends; so is
      the generator state a stochastic inner region's checkpoint stores again
      as the recompute runs it (its own recompute replays from that copy;
      released at the end of the outer's recompute before, a step measured
      4,800 bytes over its prediction: ``tests/regressions/test_nested_inner_rng.py``);
    * early stop: the outer's recompute ends as soon as it has saved again
      the last tensor the outer saved (non-reentrant checkpoint's early
      stop). An inner region saves its inputs before it runs, so when no node
      of the outer after its last inner region saves anything, the recompute
      stops at that inner region's first node: it runs only the nodes before,
      keeps that inner region's inputs, and the inner region is recomputed
      once (in its own recompute), not twice. A tensor that a node after the
      stop reads (a hold of NOTE [ Forward holds ] too) is a local of the
      call's Python until the stop unwinds it: it lives to the recompute's
      end (a random module's attention scores, held to its return: 1,016 B
      over before). Otherwise the whole outer region runs, as a one-level
      recompute does;
    * when the backward reaches an inner region's last node, the inner region
      is recomputed as a one-level region (NOTE [ Execution model ]) from the
      inputs the outer's recompute kept. torch hands them over as the inner
      checkpoint unpacks them (the outer's copy is cleared then), and the
      inner recompute saves again whatever of them its nodes save: such an
      input stays until the backward of the last inner node that saves it (a
      linear layer's or a norm's input, the residual stream); the others are
      released when the inner recompute ends. (Until issue 33 the walk
      released every one of them there: plans measured up to 9 % over their
      prediction; ``tests/scheduler/applying/test_nested_truth.py`` holds
      the walk to the allocator on real modules.)
    * Python scalars (NOTE [ Saved Python scalars ] in
      ``scheduler.tracing.costs``): a node whose autograd node saves a wrapped
      number (``scores / math.sqrt(d)``: ``DivBackward0`` saves the 8-byte
      divisor) makes that copy again each time a recompute runs it, outside
      the saved-tensor hooks, so neither checkpoint drops it: the recompute's
      autograd graph holds it until that recompute ends. The outer's
      recompute charges each node it runs its ``meta["saved_scalars"]`` from
      that node's step to its end (inner nodes too: their autograd nodes
      belong to the outer's recompute graph), and so does each inner region's
      own recompute. (Uncharged until issue 33: nested plans on a manual
      attention measured 8 bytes over their prediction,
      ``tests/regressions/test_nested_saved_scalars.py``. The one-level
      recompute does not charge them yet; see NOTE [ Saved Python scalars ].)
    * recompute cost: every node the outer's recompute runs, plus every node
      of every inner region once more.

    Outer regions with inner regions keep no nodes (``Plan.saved``; refused
    by ``Plan``), and a plan without inner regions runs exactly the one-level
    walk. What an outer region's eager forward holds (``extra_bytes``) is
    held through its recompute as for a one-level region; an inner region's
    through its own recompute.

NOTE [ The menu of inner regions ]
    The exact solvers optimise over a restricted, stated space: a region
    ``first..last`` (a module call: a span) is either one level, or nested
    with *all of its child calls* as inner regions, where the child calls are
    the maximal spans strictly inside it that are single calls (no
    ``nn.Sequential`` run: its parent's ``forward`` could not carry both,
    and no chunk of a chunked call), taken greedily left to right while
    disjoint (:func:`inner_menu`). "Outer run of calls, inner calls": a
    block with its attention and MLP inside, a stage with its blocks. So a
    nested plan is a one-level plan with a flag per region, and ``dp``
    (``nested=True``) and the brute force (``nested=True``) are exact over
    those pairs. A graph without spans has no child calls: nothing nests.
    The brute force also enumerates the whole depth-2 space
    (``pareto_frontier(graph, nested="every")``: every set of disjoint spans
    inside each region): on 25 random chains of at most 8 nodes the menu
    reached its least budget on all 25 (``tests/solvers/test_nested.py``; on
    22 before issue 33, when the walk freed the inputs inner nodes save and
    nesting looked cheaper than it runs).
"""

from __future__ import annotations

from typing import Sequence

from graphs import Graph

from .chunks import parse_chunk_module

__all__ = ["inner_menu", "nested_plan_inner"]


def _is_call(path: str) -> bool:
    """A single module call an inner region may be (not a Sequential run, nor a chunk of a chunked call)."""
    return bool(path) and "[" not in path and parse_chunk_module(path) is None and "+loss" not in path


def inner_menu(graph: Graph, a: int, b: int) -> tuple[tuple[int, int], ...]:
    """The child calls of region ``a..b`` (NOTE [ The menu of inner regions ]): ``()`` when none.

    Args:
        graph: a graph with spans (the expanded graph of a chunked plan, if any).
        a, b: the outer region, inclusive.
    """
    cache = graph.cached("_inner_menus", dict)
    key = (a, b)
    if key in cache:
        return cache[key]
    if not graph.spans:
        cache[key] = ()
        return ()
    inside = sorted({(sp.first, sp.last) for sp in graph.spans
                     if a <= sp.first and sp.last <= b and (sp.first, sp.last) != (a, b) and _is_call(sp.module)},
                    key=lambda r: (r[0], -r[1]))
    names = {}
    for sp in graph.spans:
        names.setdefault((sp.first, sp.last), []).append(sp.module)
    out: list[tuple[int, int]] = []
    end = a - 1
    for x, y in inside:
        if x > end:  # maximal: not inside the one taken before; disjoint from it
            if all(_is_call(m) for m in names[(x, y)]) and graph.span_module((x, y)) != graph.span_module((a, b)):
                out.append((x, y))
                end = y
    result = tuple(out)
    cache[key] = result
    return result


def nested_plan_inner(graph: Graph, regions: Sequence[tuple[int, int]],
                      flags: Sequence[bool]) -> tuple[tuple[int, int], ...]:
    """``Plan.inner`` for ``regions`` where ``flags`` says which are nested (each with its :func:`inner_menu`)."""
    out: list[tuple[int, int]] = []
    for (a, b), nest in zip(regions, flags):
        if nest:
            out.extend(inner_menu(graph, a, b))
    return tuple(out)
