"""What a plan adds to a step besides its recompute: region calls, kept-call bookkeeping, the chunk loop.

NOTE [ Plan overheads ]
    A plan that recomputes nothing is not free: transformers' checkpointing
    peak was beaten in memory by a chunked head that recomputed nothing, and
    measured 1.04-1.12x their step, because the chunk loop and the region
    wrappers were priced at zero. So a plan's predicted extra time is its
    recompute (the nodes' ``fwd_cost``, NOTE [ Execution model ] in
    ``solvers.model.simulate``) plus these terms, in seconds, each from a
    figure of ``graph.meta["costs"]["overheads"]`` (measured on this CPU,
    or a named GPU's table: ``scheduler.tracing.overheads``):

    * ``regions``: each checkpoint region (and each inner region of a nested
      plan) costs ``region_s`` per step: the wrapper's call, checkpoint's
      saved-tensor hooks, the recompute's set-up in the backward;
    * ``rng``: a region that draws random numbers also stores and restores
      the generator state: ``random_region_s`` more;
    * ``selective``: in a region whose plan keeps calls, every ATen call
      passes through our dispatch modes in the forward and again in the
      recompute (NOTE [ Selective checkpoint policies ] in
      ``scheduler.applying.selective``): ``selective_op_s`` per call of the
      region twice, and ``kept_call_s`` per kept call (its store entry);
      a node counts its ATen calls (``Node.dispatch``, at least one: a
      ViT's regions run 164 calls in 92 nodes);
    * the chunk loop, per chunked call ``(first, last, k)`` with ``k > 1``,
      for each of its ``k - 1`` extra chunks: ``chunk_s`` for the loop
      itself (slicing, the per-chunk loss or the ``cat``), ``op_s`` (one
      small op's forward and backward) for every node of the call
      (``chunk_launches``), the weight-gradient accumulation of the call's
      parameters (an add reading two gradients and writing one:
      ``3 * param_bytes / bytes_per_s``, ``chunk_accumulation``), and the
      matrix products run at ``rows / k`` rows instead of ``rows``
      (``chunk_gemm``: their forward and backward FLOPs times
      ``1 / rate(rows / k) - 1 / rate(rows)``, ``rate`` the float32 FLOP/s
      measured at a few row counts, ``gemm_rows``, interpolated in log rows;
      none without a table). A call the trace timed at its own shape (NOTE
      [ Chunk loops timed at their shapes ] in
      ``scheduler.tracing.chunk_times``) is priced by that instead, one term
      in place of these four: ``chunk_timed``, the loop in k chunks less
      the call whole, measured (a count not timed is read off the line
      through its timed neighbours). A fused head (NOTE [ Fused head ] in
      ``solvers.model.fused``) is timed whole too, fused against the head
      and loss as traced: the one term a plan can have below zero, what
      computing the gradients in the forward saves (a Llama head at hidden
      512, 32,000 words, 256 rows: 3.9-6.9 ms of a 575 ms step).

    One more figure is no term of its own: ``recompute_op_s``, what a
    kernel run again inside a checkpoint region costs beyond the kernel
    (its saved-tensor hooks, the autograd graph built again), which the
    roofline adds to each kernel of a node's recompute cost, ``fwd_cost``
    (``scheduler.tracing.roofline.roofline_records``): so every solver
    weighs it as recompute.

    In the solvers' units a term is ``seconds * flops_per_s`` (the graph's
    rate): ``Simulation.overhead_cost``, and ``total_cost`` = recompute +
    overheads is what menus and selections minimise (chunk counts, nested
    or one-level, the cheapest of several solvers' plans, ``ilp``'s optima
    with and without kept nodes) and what the region-merging pass lowers
    (``solvers.merge``). ``ilp``'s frontier program adds each region's call
    (:func:`region_call_cost`) to every region's recompute in its objective
    (``solvers.frontier.regions``), so it trades recompute for fewer calls
    where that pays; ``dp`` and the CP-SAT model do not yet. A graph without
    overhead figures (traced before them, or hand-built) prices them at
    zero: its plans are chosen as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from graphs import COSTS_META, Graph

from .chunks import LOSS_SUFFIX, ChunkError, _products, expand, find_tail, max_chunks
from .fused import is_fused
from ..errors import SolverInputError
from .terms import region_rng_bytes

__all__ = ["OVERHEADS_KEY", "CHUNK_TIMES_KEY", "TERMS", "chunk_times", "timed_extra", "Overheads", "graph_overheads", "overhead_seconds", "with_overheads",
           "with_extra_time", "region_call_cost"]

#: Where a graph carries its overhead figures: ``graph.meta["costs"][OVERHEADS_KEY]``.
OVERHEADS_KEY = "overheads"
#: Where a graph carries its chunk loops timed at their shapes: ``graph.meta["costs"][CHUNK_TIMES_KEY]``,
#: ``{call: {k: seconds}}`` (NOTE [ Chunk loops timed at their shapes ] in ``scheduler.tracing.chunk_times``).
CHUNK_TIMES_KEY = "chunk_times"
#: The split of a plan's overheads, in the order reports print it.
TERMS = ("regions", "rng", "selective", "chunk_loop", "chunk_launches", "chunk_accumulation", "chunk_gemm",
         "chunk_timed")
_FIGURES = ("region_s", "random_region_s", "selective_op_s", "kept_call_s", "chunk_s", "op_s", "recompute_op_s")


@dataclass(frozen=True)
class Overheads:
    """The figures NOTE [ Plan overheads ] prices a plan with (seconds; ``gemm_rows``: ``(rows, FLOP/s)``)."""

    region_s: float = 0.0
    random_region_s: float = 0.0
    selective_op_s: float = 0.0
    kept_call_s: float = 0.0
    chunk_s: float = 0.0
    op_s: float = 0.0
    recompute_op_s: float = 0.0
    gemm_rows: tuple[tuple[int, float], ...] = field(default=())
    source: str = ""

    def __post_init__(self) -> None:
        for name in _FIGURES:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise SolverInputError(f"overhead figure {name} must be a finite number >= 0, got {v!r}")
        rows = tuple(sorted((int(m), float(r)) for m, r in self.gemm_rows))
        if any(m < 1 or not math.isfinite(r) or r <= 0 for m, r in rows):
            raise SolverInputError(f"gemm_rows must be (rows >= 1, FLOP/s > 0) pairs, got {self.gemm_rows!r}")
        object.__setattr__(self, "gemm_rows", rows)

    @property
    def zero(self) -> bool:
        return not any(getattr(self, name) for name in _FIGURES) and not self.gemm_rows

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: float(getattr(self, name)) for name in _FIGURES}
        out["gemm_rows"] = [[m, r] for m, r in self.gemm_rows]
        out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Overheads":
        """Inverse of :meth:`to_dict` (missing figures are 0). Raises ValueError/TypeError on a malformed entry."""
        return cls(**{name: float(d.get(name, 0.0)) for name in _FIGURES},
                   gemm_rows=tuple((int(m), float(r)) for m, r in d.get("gemm_rows", ())),
                   source=str(d.get("source", "")))

    def rate(self, rows: float) -> float | None:
        """The float32 FLOP/s of a product over ``rows`` rows (log-linear between the measured counts)."""
        table = self.gemm_rows
        if not table:
            return None
        if rows <= table[0][0]:
            return table[0][1]
        for (m0, r0), (m1, r1) in zip(table, table[1:]):
            if rows <= m1:
                w = (math.log(rows) - math.log(m0)) / (math.log(m1) - math.log(m0))
                return r0 + w * (r1 - r0)
        return table[-1][1]


def graph_overheads(graph: Graph) -> Overheads | None:
    """The overhead figures ``graph`` was traced with, or None (priced at zero)."""
    costs = graph.meta.get(COSTS_META)
    entry = costs.get(OVERHEADS_KEY) if isinstance(costs, Mapping) else None
    if not isinstance(entry, Mapping):
        return None
    try:
        out = Overheads.from_dict(entry)
    except (TypeError, ValueError):
        return None
    return None if out.zero else out


def chunk_times(graph: Graph) -> dict[str, dict[int, float]]:
    """The chunk loops ``graph``'s trace timed, ``{call: {k: seconds}}`` (empty: none, or a malformed entry)."""
    costs = graph.meta.get(COSTS_META)
    entry = costs.get(CHUNK_TIMES_KEY) if isinstance(costs, Mapping) else None
    out: dict[str, dict[int, float]] = {}
    if not isinstance(entry, Mapping):
        return out
    for name, table in entry.items():
        try:
            parsed = {int(k): float(s) for k, s in table.items()}
        except (AttributeError, TypeError, ValueError):
            continue
        if parsed and all(k >= 1 and math.isfinite(s) for k, s in parsed.items()):
            out[str(name)] = parsed
    return out


def timed_extra(table: Mapping[int, float], k: int) -> float:
    """What the loop in ``k`` chunks adds, from ``table``'s timed counts (``{k: seconds}``; 1 chunk adds 0 unless
    timed: a fused head whole, which can save time): the figure of ``k``, else read off the line through the two
    timed counts around it (or the last two), never below the least figure of the table or 0."""
    if k < 1:
        return 0.0
    if k in table:
        return table[k]
    if k == 1:
        return 0.0
    points = sorted({1: 0.0, **table}.items())
    below = [p for p in points if p[0] < k]
    above = [p for p in points if p[0] > k]
    (k0, s0), (k1, s1) = (below[-1], above[0]) if above else (points[-2], points[-1])
    return max(min(0.0, *table.values()), s0 + (s1 - s0) * (k - k0) / (k1 - k0))


def _call_name(graph: Graph, first: int, last: int) -> str | None:
    """The chunked call ``first..last`` as plans name it: ``HEAD+loss`` for the tail, else its module path."""
    if last == len(graph) - 1:
        try:
            tail = find_tail(graph)
        except ChunkError:
            return None
        return tail.head + LOSS_SUFFIX if tail.first == first else None
    return next((sp.module for sp in graph.spans if sp.first == first and sp.last == last), None)


def region_call_cost(graph: Graph) -> int:
    """One region's call (``region_s``) in the graph's cost units (FLOP-equivalents), 0 without figures: what
    the exact solvers add to their objective per region (NOTE [ Plan overheads ])."""
    o = graph_overheads(graph)
    rate = (graph.meta.get(COSTS_META) or {}).get("flops_per_s")
    if o is None or not o.region_s or not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0:
        return 0
    return int(round(o.region_s * float(rate)))


def with_overheads(graph: Graph, overheads: Overheads | Mapping[str, Any]) -> Graph:
    """``graph`` priced with ``overheads`` (a test's injected figures, or a re-calibration)."""
    import dataclasses

    figures = overheads if isinstance(overheads, Overheads) else Overheads.from_dict(overheads)
    costs = dict(graph.meta.get(COSTS_META) or {})
    costs[OVERHEADS_KEY] = figures.to_dict()
    return dataclasses.replace(graph, meta={**graph.meta, COSTS_META: costs})


def _bandwidth(graph: Graph) -> float | None:
    peaks = (graph.meta.get(COSTS_META) or {}).get("peaks")
    bw = peaks.get("bytes_per_s") if isinstance(peaks, Mapping) else None
    return float(bw) if isinstance(bw, (int, float)) and not isinstance(bw, bool) and bw > 0 else None


def overhead_seconds(graph: Graph, regions: Sequence[tuple[int, int]], saved: Sequence[int] = (),
                     inner: Sequence[tuple[int, int]] = (), chunks: Sequence[tuple[int, int, int]] = ()
                     ) -> dict[str, float]:
    """The plan's overheads in seconds, by :data:`TERMS` (NOTE [ Plan overheads ]); all 0 without figures.

    Args:
        graph: the traced graph (not expanded); ``regions``, ``saved`` and
            ``inner`` are positions of ``expand(graph, chunks)``, as a plan's.
    """
    out = dict.fromkeys(TERMS, 0.0)
    o = graph_overheads(graph)
    timed = chunk_times(graph) if chunks else {}
    for first, last, k in chunks:
        table = timed.get(_call_name(graph, first, last) or "")  # k = 1: a fused head whole, where timed
        if table:
            out["chunk_timed"] += timed_extra(table, k)
    if o is None:
        return out
    run = expand(graph, chunks) if chunks else graph
    calls = list(regions) + list(inner)
    out["regions"] = o.region_s * len(calls)
    if o.random_region_s:
        out["rng"] = o.random_region_s * sum(1 for rng in region_rng_bytes(run, calls) if rng)
    if saved and (o.selective_op_s or o.kept_call_s):
        kept = sorted(saved)
        selective = {r for r in regions if any(r[0] <= k <= r[1] for k in kept)}
        calls = sum(max(1, len(run.nodes[i].dispatch)) for a, b in selective for i in range(a, b + 1))
        out["selective"] = 2 * o.selective_op_s * calls + o.kept_call_s * len(kept)
    bandwidth = _bandwidth(graph)
    for first, last, k in chunks:
        if k <= 1 or timed.get(_call_name(graph, first, last) or ""):
            continue  # whole, or timed at its shape (above)
        extra = k - 1
        nodes = graph.nodes[first:last + 1]
        out["chunk_loop"] += o.chunk_s * extra
        out["chunk_launches"] += o.op_s * extra * len(nodes)
        fused = last == len(graph) - 1 and is_fused(graph, find_tail(graph).head)  # adds into one buffer in place
        if bandwidth and not fused:
            out["chunk_accumulation"] += extra * 3 * sum(nd.param_bytes for nd in nodes) / bandwidth
        flops = sum(nd.fwd_flops + nd.bwd_flops for nd in nodes if _products(nd))
        rows = max_chunks(graph, first, last)
        full, part = o.rate(rows), o.rate(math.ceil(rows / k))
        if flops and full and part:
            out["chunk_gemm"] += max(0.0, flops * (1.0 / part - 1.0 / full))
    return out


def with_extra_time(findings: Mapping[str, Any], sim: Any) -> dict[str, Any]:
    """``findings`` with the plan's predicted extra time (NOTE [ Plan overheads ]): ``extra_time_s`` the total,
    ``extra_recompute_s`` and ``extra_TERM_s`` for each overhead term that is not 0 (findings are scalars)."""
    out = {k: v for k, v in findings.items() if not (k.startswith("extra_") and k.endswith("_s"))}
    if sim.recompute_time_s is None:
        return out
    split = {"recompute": sim.recompute_time_s, **{k: v for k, v in sim.overhead_s.items() if v}}
    out.update({f"extra_{k}_s": float(v) for k, v in split.items()})
    out["extra_time_s"] = float(sum(split.values()))
    return out
