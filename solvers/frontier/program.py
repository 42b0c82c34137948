"""An exact dynamic program over the topological order, for graphs of narrow cut width.

NOTE [ The frontier DP ]
    ``ilp``'s model (NOTE [ An exact model of simulate ]) shows that every
    live-bytes term at a step ``k`` is either

    * a prefix sum that only grows along the order: ``A(k)``, the forward
      copies already closed (last consumer at or before ``k``) that some
      holder keeps, plus the buffers of stored nodes at or before ``k``; or
    * a term local to the segment holding ``k`` (a stored node, or a region
      ``[p, b]``): the region's recomputed copies, its own buffers, gradients
      at its end, the snapshots of its stateful nodes, the extra bytes of
      the span it equals (eager lifetimes in a recompute); or
    * the forward copies of tensors still *open* at ``k`` (``j <= k <
      last consumer``), alive exactly when a holder keeps them.

    At a segment boundary ``p`` nothing else crosses: no region spans it, so
    a tensor ``j < p`` read by a region at or after ``p`` is that region's
    input (held), and whether an open tensor is already held (it saves itself
    outside a region, a stored consumer saved it, a region read it) is one bit
    per open tensor. So a plan prefix ending at ``p`` is summarised by those
    bits and the number ``A(p - 1)``; every later constraint reads
    ``A + (terms of the bits and the later plan) <= cap``. Among prefixes with
    the same bits, one with less ``A`` and less recompute dominates: per
    boundary and bit pattern we keep the Pareto front of ``(A, FLOPs)``, and
    extend it by a stored node or a region ``[p, b]`` (for every ``b`` while
    the region fits). The front at ``n`` holds the optimum, exact over all
    interval plans: the same set ``ilp`` and the brute force search. On a
    graph with spans only the ``[p, b]`` that are spans extend a front
    (NOTE [ Module-aligned regions ] in ``graphs.graph``): exact over the
    span-only plans, and a start where no span begins costs nothing. A
    region's cost is its recompute plus its call (``region_call_cost``,
    NOTE [ Plan overheads ] in ``solvers.model.overheads``; 0 without
    overhead figures), so "FLOPs" here is recompute plus calls.

    The states per boundary are ``2 ** open``, so the program is for graphs
    where few tensors cross any position (a transformer: the residual stream,
    the attention mask, one or two inside a block); ``width`` measures it and
    ``ilp`` hands wider graphs to CP-SAT. Tensors the caller holds to the
    end (sinks, and the outputs of a ``"held"`` loop, NOTE [ The user's
    loop ] in ``graphs.graph``) join ``A`` when produced whoever reads them,
    so they carry no bit either; only their recomputed copies are a
    region's. Tensors of zero bytes (views,
    ``expand``, ``unsqueeze``: a third of a traced Llama's op graph) change no
    live-bytes term whether held or not, so they carry no bit and do not
    count towards the width (a Llama op graph: 15 open tensors, 9 with
    bytes). The width is counted with a difference array, in time linear in
    the graph, before anything else is built. With ``objective="peak"`` the second
    coordinate is the peak so far instead of the FLOPs (both only grow), which
    gives the least peak of any interval plan.

    A chain of identical blocks (``solvers.blocks.compose``, NOTE [ Composing
    repeated blocks ]) is crossed one block at a time: at a block's first
    node the program applies the block's own Pareto front, computed once for
    every bit pattern it is entered with, instead of walking its nodes.
    With ``selective`` each region is also tried once per entry of its menu
    of kept sets (NOTE [ Kept nodes in the frontier DP ] in
    ``solvers.frontier.kept``), in a block's own front too. With ``nested``
    each region with child calls is also tried nested (NOTE [ Nested regions
    in the frontier DP ] in ``solvers.frontier.nested``; blocks then not
    composed).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphs import Graph

from ..deadline import Deadline, OutOfTime
from ..dp.profiles import NEG, node_arrays
from ..errors import SolverBug, SolverOptionError
from ..blocks.front import BlockFrontTooLarge
from .front import Front, TooWide, _open_sets, open_counts, round_up, trace_back, width
from .kept import KeptRegions
from .nested import NestedRegions
from .regions import RegionTerms
from ..model.spans import SpanIndex
from ..model.terms import terms_of
from ..model.nested import nested_plan_inner
from ..model.overheads import region_call_cost

__all__ = ["FrontierDP", "FrontierResult", "FrontierTimeout", "width", "open_counts", "MAX_WIDTH", "TooWide"]

log = logging.getLogger(__name__)

#: Widest graph (most tensors of non-zero bytes open at one position) the program is run on by default.
MAX_WIDTH = 12


#: Work units (NOTE [ The frontier program's work ]) one idle core does in about a second (fitted on
#: chains, residual graphs, transformers, repeated blocks and a Llama op graph, with and without kept nodes).
WORK_PER_S = 15_000_000
#: What one Python-level step of the program (a call, a loop turn) weighs in work units.
STEP_WORK = 1200
#: What one front entry carried over (built, sorted, merged) and one array element handled weigh.
ENTRY_WORK = 1


#: Entries of the open sets (``solvers.frontier.front._open_sets``) an idle core builds in a second (about 3
#: million here; a margin below it).
OPEN_ENTRIES_PER_S = 2_000_000


class FrontierTimeout(OutOfTime):
    """The program stopped before it finished: at its work limit (``by="work limit"``, the same on any
    machine) or at the deadline (``by="time limit"``)."""


@dataclass(frozen=True)
class FrontierResult:
    """The optimum: regions, its objective (FLOPs, or peak bytes), and the work done."""

    regions: tuple[tuple[int, int], ...]
    objective: int
    states: int
    wall_s: float
    blocks: int = 0  #: blocks crossed by their own front (NOTE [ Composing repeated blocks ])
    saved: tuple[int, ...] = ()  #: kept nodes (NOTE [ Kept nodes in the frontier DP ])
    inner: tuple[tuple[int, int], ...] = ()  #: inner regions (NOTE [ Nested regions in the frontier DP ])


class FrontierDP(RegionTerms):
    """The program for one graph (NOTE [ The frontier DP ]).

    Args:
        graph: the cost graph.
        max_width: refuse (:class:`TooWide`) graphs with more open tensors
            (of non-zero bytes) at a boundary (None: any width, for
            ``max_free`` runs). Decided in linear time, before anything else.
        blocks: cross a chain of identical blocks by the blocks' own fronts
            (``solvers.blocks.compose``) where the graph has one; exact either way.
        selective: regions may also keep nodes (selective recompute): exact
            over ``(region, menu entry)`` pairs (NOTE [ Kept nodes in the
            frontier DP ]), repeated blocks composed with them.
    """

    def __init__(self, graph: Graph, *, max_width: int | None = MAX_WIDTH, blocks: bool = True,
                 selective: bool = False, nested: bool = False, deadline: Deadline | None = None) -> None:
        self.graph = graph
        na = node_arrays(graph, frozenset())
        self.na = na
        n = self.n = len(graph)
        nodes = graph.nodes
        self.out = na.out
        self.lc = na.lc
        self.sink = na.sink  # held by the caller to the end: in A from their forward step, no bit
        bits = np.where(na.sink, 0, na.out)
        counts = open_counts(bits, na.lc)
        w = int(counts.max())
        if max_width is not None and w > max_width:
            raise TooWide(w, max_width, int(np.argmax(counts)))
        self.width = w
        entries = int(counts.sum())  # the open sets' size: millions on a wide graph (NOTE [ One deadline ])
        if deadline is not None and entries / OPEN_ENTRIES_PER_S * deadline.slowdown > deadline.left():
            raise FrontierTimeout(f"the frontier program's open sets ({entries} entries, {w} tensors open at one "
                                  f"position) would not be built within the {deadline.limit_s:g} s time limit")
        self.opens = _open_sets(bits, na.lc)
        rg = na.rg
        terms = terms_of(graph)  # NOTE [ One table of terms ]
        self.selfsave = np.array(terms.self_save, dtype=bool)
        self.savers = [frozenset(c) for c in terms.savers]
        self.readers = graph.succs  # ascending
        self.recomputable = np.array([nd.recomputable for nd in nodes])
        lc, fs = na.lc, na.fs
        self.sinks_after = np.array(terms.sink_bytes_after, dtype=np.int64)  # sinks produced at k or later
        self.open_fwd = na.open_all  # forward copies awaiting a consumer at k (j < k <= lc[j])
        # a recomputed copy awaits consumers until here (a held one, like a region output, to the end)
        self.last = np.minimum(np.where((lc >= 0) & ~na.sink, lc, n - 1), fs - 1)
        self.pflops = np.concatenate(([0], np.cumsum(na.flops)))
        # NOTE [ Plan overheads ]: each region's call joins the objective (0 without overhead figures)
        self.call = region_call_cost(graph)
        self.pstate = np.concatenate(([0], np.cumsum(na.state)))
        # NOTE [ RNG state per region ] in solvers.model.terms: a region with a stochastic node stores the state.
        self.rng = int(graph.rng_state_bytes)
        self.pstoch = np.concatenate(([0], np.cumsum([bool(nd.stochastic) for nd in graph.nodes]))).astype(np.int64)
        self.const = int(graph.param_bytes + graph.input_bytes)
        self.rg = rg
        # NOTE [ Module-aligned regions ]: on a graph with spans, the regions [p, b] are spans only.
        self.span_ends = SpanIndex(graph).ends
        # span_extra_from[p]: (b, extra_bytes) of the spans (p, b) with extra bytes (eager lifetimes).
        self.span_extra_from: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for (a, b), extra in graph.span_extra_bytes().items():
            self.span_extra_from[a].append((b, extra))
        self.work = 0  # NOTE [ The frontier program's work ]: of the last solve
        self._limits: tuple[Deadline | None, int | None] = (None, None)  # of the running solve
        self.kept = KeptRegions(self) if selective else None  # NOTE [ Kept nodes in the frontier DP ]
        if self.kept is not None and not self.kept.any:
            self.kept = None
        self.nested = NestedRegions(self) if nested else None  # NOTE [ Nested regions in the frontier DP ]
        if self.nested is not None and not self.nested.any:
            self.nested = None
        self.chain: Any = None
        if blocks and self.nested is None:
            from ..blocks.compose import find_chain  # the blocks build on this program's steps

            self.chain = find_chain(self)

    def count(self, *, steps: int = 0, elements: int = 0, entries: int = 0) -> None:
        """Add to :attr:`work` (NOTE [ The frontier program's work ]): Python-level steps, array elements
        handled, front entries carried over (each is built, sorted and merged)."""
        self.work += STEP_WORK * steps + elements + ENTRY_WORK * entries

    # ------------------------------------------------------------- steps
    def stored_step(self, p: int, key: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
        """Node ``p`` stored, entered with the open tensors ``key`` held.

        Returns:
            ``(dA, lf, lb, nkey)``: what joins the retained bytes, the
            step's live bytes less the retained bytes before it in the
            forward (``lf``) and backward (``lb``, ``NEG`` for none), and the
            held open tensors after it.
        """
        na, out, lc = self.na, self.out, self.lc
        held = set(key) | {j for j in self.opens[p] if p in self.savers[j]}
        sink = bool(self.sink[p])
        dA = int(na.own[p]) + sum(int(out[j]) for j in held if lc[j] == p) + (int(out[p]) if sink else 0)
        fa = sum(int(out[j]) for j in held if lc[j] > p) + (
            int(out[p]) if lc[p] > p and self.selfsave[p] and not sink else 0)
        lf = int(self.open_fwd[p] + na.cur[p])
        lb = int(dA + fa + self.sinks_after[p + 1] + na.gb[p]) if self.rg[p] else NEG
        nkey = tuple(j for j in self.opens[p + 1] if j in held or (j == p and self.selfsave[p]))
        return dA, lf, lb, nkey

    # --------------------------------------------------------------- solve
    def solve(self, budget_bytes: int | None, *, objective: str = "flops",
              upper: int | None = None, time_limit_s: float | None = None, deadline: Deadline | None = None,
              max_work: int | None = None, max_free: int | None = None) -> FrontierResult | None:
        """The optimum under ``budget_bytes`` (``objective="flops"``), or the
        least peak (``objective="peak"``; ``budget_bytes``, when given, caps
        the peaks considered); None when no interval plan fits.

        Args:
            upper: prune prefixes whose objective exceeds this (a known plan's).
            time_limit_s: raise :class:`FrontierTimeout` past this many seconds (a deadline of its own).
            deadline: raise :class:`FrontierTimeout` once it passes (the solve's, NOTE [ One deadline ]).
            max_work: raise :class:`FrontierTimeout` once the program has done this much work
                (NOTE [ The frontier program's work ]): the same answer on any machine. None: no limit.
            max_free: a heuristic for wide graphs: at each boundary keep at
                most this many open tensors *not* held (the largest); count
                the others as held. Live bytes are then never under-counted,
                so the plan fits (``simulate`` checks it) but is optimal only
                among what that count allows; the patterns per boundary are
                bounded whatever the width. None: exact.
        """
        if deadline is None and time_limit_s is not None:
            deadline = Deadline(time_limit_s)
        self.work = 0
        if self.chain is not None and max_free is None:
            try:
                return self._solve(budget_bytes, objective, upper, deadline, max_work, None, self.chain)
            except BlockFrontTooLarge as exc:
                log.info("frontier %s: blocks not composed (%s); walking every node", self.graph.name, exc)
                self.chain = None
        return self._solve(budget_bytes, objective, upper, deadline, max_work, max_free, None)

    def _solve(self, budget_bytes: int | None, objective: str, upper: int | None, deadline: Deadline | None,
               max_work: int | None, max_free: int | None, chain: Any) -> FrontierResult | None:
        if objective not in ("flops", "peak"):
            raise SolverOptionError(f"frontier program: objective must be 'flops' or 'peak', not {objective!r}")
        t0 = time.perf_counter()
        self._limits = (deadline, max_work)
        peak = objective == "peak"
        n = self.n
        cap = (int(budget_bytes) - self.const) if budget_bytes is not None else (1 << 62)
        if peak and upper is not None:
            upper = int(upper) - self.const
        if cap < 0:
            return None
        a_max = self._a_max(cap)
        fronts = [Front(peak) for _ in range(n + 1)]
        zero = np.zeros(1, dtype=np.int64)
        fronts[0].pending[()] = [(zero, zero, np.full(1, -1, dtype=np.int64), zero)]
        fronts[0].metas.append((-1, None, -1))
        states = crossed = 0
        report = max(1, n // 10)
        for p in range(n):
            self._check_limits(p, t0, deadline, max_work, states, report)
            if p:
                fronts[p - 1].release()  # its entries were all extended
            fr = fronts[p]
            if chain is not None and chain.inside[p]:
                if fr.pending:  # NOTE [ Composing repeated blocks ]: find_chain rules this out
                    raise SolverBug(f"frontier: a step ends inside block {chain.block_at(p)} (node {p})")
                continue
            fr.settle(upper, a_max[p])
            if not fr.keys:
                continue
            settled = sum(len(v[0]) for v in fr.keys.values())
            states += settled
            self.count(steps=len(fr.keys), entries=settled)
            block_end = -1
            if chain is not None and p in chain.seams:
                # a whole block by its own front; then only regions [p, b] past its end
                block_end = chain.cross(self, p, fr, fronts[chain.seams[p] + 1], cap)
                crossed += 1
            else:
                self._extend_stored(p, fr, fronts[p + 1], cap, max_free)
            self._extend_regions(p, fr, fronts, cap, max_free, block_end)
        last = fronts[n]
        last.settle(upper, a_max[n])
        if not last.keys:
            return None
        key = min(last.keys, key=lambda k: int(last.keys[k][1].min()))
        idx = int(np.argmin(last.keys[key][1]))
        best = int(last.keys[key][1][idx])
        outers: list[tuple[int, int]] = []
        regions, saved = trace_back(fronts, n, key, idx, nested=outers)
        inner = nested_plan_inner(self.graph, regions, [r in outers for r in regions]) if outers else ()
        value = best + self.const if peak else best
        log.info("frontier %s: %s %d over %d states in %.2fs%s", self.graph.name, objective, value, states,
                 time.perf_counter() - t0, f" ({crossed} blocks by their fronts)" if crossed else "")
        return FrontierResult(regions, value, states, time.perf_counter() - t0, crossed, saved, inner)

    # ------------------------------------------------------- solve's phases
    def _a_max(self, cap: int) -> list[int]:
        """``a_max[p]``: a prefix with more ``A`` fails a later step whatever follows (plan-independent
        lower bounds of the steps ``k >= p``: forward copies awaiting consumers, gradients, sinks)."""
        na = self.na
        sinkcum = na.p_sink  # sinkcum[k]: sinks before k
        need = np.maximum(self.open_fwd + na.cur + sinkcum[:-1], np.where(self.rg, na.gb + int(sinkcum[-1]), NEG))
        suffix = np.maximum.accumulate(need[::-1])[::-1]
        return [int(cap + sinkcum[p] - suffix[p]) for p in range(self.n)] + [1 << 62]

    def _check_limits(self, p: int, t0: float, deadline: Deadline | None, max_work: int | None, states: int,
                      report: int) -> None:
        """Log progress; raise :class:`FrontierTimeout` past the work limit, or the deadline.

        NOTE [ The frontier program's work ]
            The program counts its work as it goes: per boundary the entries
            it settles and its keys, per step the entries it carries over and
            the region ends it tries (for every held pattern), per block
            crossed the block plans it applies. The count is the same on any
            machine, so a run stopped by ``max_work`` stops at the same node
            on an idle and on a busy one, and a run that finishes does so
            under any load; :data:`WORK_PER_S` units take about a second of
            one idle core. The deadline only stops a run the clock would see
            overrun. (A projection of the time left from the time so far once
            stopped a 1,000-node chain after 0.33 s of CPU, "would need about
            277 s", that finishes in a few seconds.)
        """
        if p and p % report == 0:
            log.info("frontier %s: node %d of %d, %d states, work %d, %.1fs", self.graph.name, p, self.n, states,
                     self.work, time.perf_counter() - t0)
        self.stop_if_over(p)

    def stop_if_over(self, p: int) -> None:
        """Raise :class:`FrontierTimeout` past the running solve's work limit or deadline (also looked at
        while a block's front is built, node ``p`` of it)."""
        deadline, max_work = self._limits
        if max_work is not None and self.work > max_work:
            raise FrontierTimeout(f"the frontier program reached node {p} of {self.n} at its work limit "
                                  f"({max_work} units)", by="work limit")
        if deadline is not None and deadline.expired():
            raise FrontierTimeout(f"the frontier program reached node {p} of {self.n} in the {deadline.limit_s:g} s "
                                  "time limit")

    def _extend_stored(self, p: int, fr: Front, target: Front, cap: int, max_free: int | None) -> None:
        """Carry the front at ``p`` over node ``p`` stored."""
        for key, (a, o, *_rest) in fr.keys.items():
            dA, lf, lb, nkey = self.stored_step(p, key)
            local = max(lf, lb)
            cut = int(np.searchsorted(a, cap - local, side="right"))
            self.count(steps=1, entries=cut)
            if cut:
                if max_free is not None:
                    nkey = round_up(nkey, self.opens[p + 1], max_free, self.out)
                target.add(nkey, a, o, cut, dA, 0, local, (p, key, -1))

    def _region_ends(self, p: int, block_end: int) -> tuple[int, np.ndarray | None] | None:
        """``(kmax, endok)``: the farthest end of a region ``[p, b]`` (recomputable nodes,
        spans) and which ends are allowed (None: all); None when no region starts at ``p``."""
        if not self.recomputable[p]:
            return None
        kmax = p
        while kmax + 1 < self.n and self.recomputable[kmax + 1]:
            kmax += 1
        if self.span_ends is None:
            return kmax, None
        allowed = self.span_ends[p]  # usable spans: all nodes recomputable, so <= kmax
        allowed = allowed[allowed > block_end]
        if not len(allowed):
            return None
        kmax = int(allowed[-1])
        endok = np.zeros(kmax - p + 1, dtype=bool)
        endok[allowed - p] = True
        return kmax, endok

    def _extend_regions(self, p: int, fr: Front, fronts: list[Front], cap: int, max_free: int | None,
                        block_end: int) -> None:
        """Carry the front at ``p`` over every region ``[p, b]`` that fits (and, with ``selective``,
        every menu entry it may keep: NOTE [ Kept nodes in the frontier DP ])."""
        ends = self._region_ends(p, block_end)
        if ends is None:
            return
        kmax, endok = ends
        terms = self.region_terms(p, kmax)
        if self.kept is not None:
            self.kept.extend(p, fr, fronts, terms, cap, endok, max_free)
        if self.nested is not None:
            self.nested.extend(p, fr, fronts, terms, cap, endok, max_free)
        fwdm, bwd, rc, cA, snap, gr, cost, _, _, rng = terms
        amin = min(int(v[0][0]) for v in fr.keys.values())
        # With no open tensor alive the local peak only grows with b (but for gr): it bounds the reach.
        reach = np.maximum(fwdm, np.maximum(np.maximum.accumulate(bwd) + rng, np.maximum.accumulate(rc) + snap))
        over = np.nonzero(reach > cap - amin)[0]
        m = int(over[0]) if len(over) else kmax - p + 1
        if m == 0:
            return
        first_reader, bounds = self.reader_bounds(p, m)
        cache: dict[frozenset, tuple[np.ndarray, np.ndarray]] = {}
        nkeys: dict[tuple[frozenset, int], tuple[int, ...]] = {}
        opens = self.opens[p]
        for key, (a, o, *_rest) in fr.keys.items():
            held = frozenset(key)
            room = cap - int(a[0])
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                eff = held | frozenset(j for j in opens if first_reader[j] <= lo)
                if eff not in cache:
                    self.count(steps=1, elements=m)
                    lf, lb, mono = self.region_maxima(terms, eff, p, m)
                    cache[eff] = (mono, np.maximum(lf, lb))
                mono, local = cache[eff]
                over = np.nonzero(mono[lo - p:hi - p] > room)[0]
                end = lo + int(over[0]) if len(over) else hi  # mono grows with b: longer regions fail too
                cuts = np.searchsorted(a, cap - local[lo - p:end - p], side="right")
                if endok is not None:
                    cuts = cuts * endok[lo - p:end - p]
                self.count(steps=1, elements=end - lo, entries=int(cuts.sum()))
                for off in np.nonzero(cuts)[0].tolist():
                    b = lo + off
                    i = b - p
                    nkey = nkeys.get((eff, b))
                    if nkey is None:
                        nkey = self.region_nkey(eff, p, b)
                        if max_free is not None:
                            nkey = round_up(nkey, self.opens[b + 1], max_free, self.out)
                        nkeys[(eff, b)] = nkey
                    fronts[b + 1].add(nkey, a, o, int(cuts[off]), int(cA[i]), int(cost[i]), int(local[i]), (p, key, b))
                if end < hi:
                    break
