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
    span-only plans, and a start where no span begins costs nothing.

    The states per boundary are ``2 ** open``, so the program is for graphs
    where few tensors cross any position (a transformer: the residual stream,
    the attention mask, one or two inside a block); ``width`` measures it and
    ``ilp`` hands wider graphs to CP-SAT. With ``objective="peak"`` the second
    coordinate is the peak so far instead of the FLOPs (both only grow), which
    gives the least peak of any interval plan.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from graphs import Graph

from .dp_model import NEG, node_arrays
from .spans import SpanIndex

__all__ = ["FrontierDP", "FrontierResult", "FrontierTimeout", "width", "MAX_WIDTH", "TooWide"]

log = logging.getLogger(__name__)
_INF = 1 << 40

#: Widest graph (most tensors open at one position) the program is run on by default.
MAX_WIDTH = 12


class TooWide(ValueError):
    """The graph has more open tensors at some position than the program allows."""


class FrontierTimeout(TimeoutError):
    """The program did not finish within its time limit."""


def _open_sets(lc: np.ndarray) -> list[list[int]]:
    """``opens[p]``: tensors ``j < p <= lc[j]`` (open at the boundary before ``p``)."""
    n = len(lc)
    opens: list[list[int]] = [[] for _ in range(n + 1)]
    for j in range(n):
        for p in range(j + 1, int(lc[j]) + 1):
            opens[p].append(j)
    return opens


def width(graph: Graph) -> int:
    """The most tensors open at any boundary of the topological order."""
    return max(len(o) for o in _open_sets(node_arrays(graph, frozenset()).lc))


@dataclass(frozen=True)
class FrontierResult:
    """The optimum: regions, its objective (FLOPs, or peak bytes), and the work done."""

    regions: tuple[tuple[int, int], ...]
    objective: int
    states: int
    wall_s: float


def _pareto(a, o, si, mi):
    """Entries no other entry dominates (less or equal A and objective), sorted by A."""
    # A stable sort merges the already sorted runs the chunks are.
    order = np.argsort(a, kind="stable")
    a, o, si, mi = a[order], o[order], si[order], mi[order]
    keep = np.ones(len(a), dtype=bool)
    keep[1:] = o[1:] < np.minimum.accumulate(o)[:-1]
    a, o, si, mi = a[keep], o[keep], si[keep], mi[keep]
    # Equal A: the kept entries' objectives fall, so the last of a run is the one to keep.
    last = np.ones(len(a), dtype=bool)
    last[:-1] = a[:-1] != a[1:]
    return a[last], o[last], si[last], mi[last]


class _Front:
    """Pareto fronts ``(A, objective)`` with back pointers, per bit pattern, at one boundary.

    An entry points back to its source entry (``si``, an index into the
    source front) and to ``metas[mi]``: (source boundary, source key, region
    end or -1 for a stored node). Arriving entries stay *lazy* (a slice of
    the source front and the segment's shifts) until the boundary is reached
    or too many are pending; then they are built and merged at once.
    """

    __slots__ = ("pending", "keys", "metas", "peak")

    #: Merge a key's pending chunks once this many arrive (bounds the memory of far boundaries).
    COMPACT = 64

    def __init__(self, peak: bool) -> None:
        self.pending: dict[tuple[int, ...], list[tuple]] = {}
        self.keys: dict[tuple[int, ...], tuple] = {}
        self.metas: list[tuple] = []
        self.peak = peak

    def add(self, key, a, o, cut: int, shift_a: int, shift_o: int, local: int, meta: tuple) -> None:
        """Entries ``[:cut]`` of a source front ``(a, o)``, carried over one segment."""
        self.metas.append(meta)
        chunks = self.pending.setdefault(key, [])
        chunks.append((a, o, cut, shift_a, shift_o, local, len(self.metas) - 1))
        if len(chunks) >= self.COMPACT:
            self.pending[key] = [_pareto(*self._build(chunks))]

    def _build(self, chunks):
        built = [c for c in chunks if len(c) == 4]
        lazy = [c for c in chunks if len(c) != 4]
        arrays = [list(x) for x in zip(*built)] if built else [[], [], [], []]
        if lazy:
            cuts = np.array([c[2] for c in lazy], dtype=np.int64)
            src_a = np.concatenate([c[0][:c[2]] for c in lazy])
            src_o = np.concatenate([c[1][:c[2]] for c in lazy])

            def rep(i):
                return np.repeat(np.array([c[i] for c in lazy], dtype=np.int64), cuts)

            if self.peak:
                obj = np.maximum(src_o, src_a + rep(5))
            else:
                obj = src_o + rep(4)
            starts = np.concatenate(([0], np.cumsum(cuts)[:-1]))
            arrays[0].append(src_a + rep(3))
            arrays[1].append(obj)
            arrays[2].append(np.arange(len(src_a), dtype=np.int64) - np.repeat(starts, cuts))
            arrays[3].append(rep(6))
        return tuple(np.concatenate(x) for x in arrays)

    def settle(self, prune_above: int | None, a_max: int) -> None:
        """Merge the chunks of each key into its Pareto front (A ascending,
        objective strictly descending), dropping entries with ``A > a_max``
        (no continuation fits) or an objective above ``prune_above``."""
        for key, chunks in self.pending.items():
            a, o, si, mi = self._build(chunks)
            keep = a <= a_max
            if prune_above is not None:
                keep &= o <= prune_above
            if not keep.all():
                a, o, si, mi = a[keep], o[keep], si[keep], mi[keep]
            if len(a):
                self.keys[key] = _pareto(a, o, si, mi)
        self.pending = {}

    def release(self) -> None:
        """Keep only the back pointers once the boundary is processed."""
        self.keys = {k: (None, None, v[2], v[3]) for k, v in self.keys.items()}


class FrontierDP:
    """The program for one graph (NOTE [ The frontier DP ]).

    Args:
        graph: the cost graph.
        max_width: refuse (:class:`TooWide`) graphs with more open tensors at
            a boundary (None: any width, for ``max_free`` runs).
    """

    def __init__(self, graph: Graph, *, max_width: int | None = MAX_WIDTH) -> None:
        self.graph = graph
        na = node_arrays(graph, frozenset())
        self.na = na
        n = self.n = len(graph)
        nodes = graph.nodes
        self.out = na.out
        self.lc = na.lc
        self.opens = _open_sets(na.lc)
        w = max((len(o) for o in self.opens), default=0)
        if max_width is not None and w > max_width:
            raise TooWide(f"{w} tensors are open at one position (max_width {max_width})")
        self.width = w
        rg = na.rg
        self.selfsave = np.array([bool(nd.requires_grad and nd.saves_output) for nd in nodes])
        self.savers: list[set[int]] = [set() for _ in range(n)]
        for k, nd in enumerate(nodes):
            if nd.requires_grad:
                for name in nd.saves_inputs:
                    self.savers[graph.index[name]].add(k)
        self.readers = [sorted(s) for s in graph.succs]
        self.recomputable = np.array([nd.recomputable for nd in nodes])
        lc, fs = na.lc, na.fs
        self.sinks_after = na.p_sink[-1] - na.p_sink  # sinks_after[k]: outputs nobody reads, produced at k or later
        self.open_fwd = na.open_all  # forward copies awaiting a consumer at k (j < k <= lc[j])
        self.last = np.array([min(int(lc[j]) if lc[j] >= 0 else n - 1, int(fs[j]) - 1) for j in range(n)], dtype=np.int64)
        self.pflops = np.concatenate(([0], np.cumsum(na.flops)))
        self.pstate = np.concatenate(([0], np.cumsum(na.state)))
        self.const = int(graph.param_bytes + graph.input_bytes)
        self.rg = rg
        # NOTE [ Module-aligned regions ]: on a graph with spans, the regions [p, b] are spans only.
        self.span_ends = SpanIndex(graph).ends
        # span_extra_from[p]: (b, extra_bytes) of the spans (p, b) with extra bytes (eager lifetimes).
        self.span_extra_from: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for (a, b), extra in graph.span_extra_bytes().items():
            self.span_extra_from[a].append((b, extra))

    # ------------------------------------------------------------ regions
    def _region_arrays(self, p: int, kmax: int):
        """Bit-independent parts of the steps ``k`` in ``[p, kmax]`` of a region starting at ``p``."""
        na, out, lc = self.na, self.out, self.lc
        ks = np.arange(p, kmax + 1)
        m = len(ks)
        # dA[k - p]: closed-and-held bytes entering A at k (open j < p close held: the region reads them).
        dA = np.zeros(m, dtype=np.int64)
        for j in self.opens[p]:
            if lc[j] <= kmax:
                dA[lc[j] - p] += out[j]
        dA += (out[p:kmax + 1] * (lc[p:kmax + 1] < 0))
        cA = np.cumsum(dA)
        cA_prev = np.concatenate(([0], cA[:-1]))
        js = ks  # as producers j
        # s[k]: j in [p, k-1] with fs[j] <= k; q[k]: j in [p, k-1] with last[j] >= k.
        ds = np.zeros(m + 1, dtype=np.int64)
        start = np.maximum(js + 1, na.fs[p:kmax + 1])
        ok = start <= kmax
        np.add.at(ds, start[ok] - p, out[p:kmax + 1][ok])
        s = np.cumsum(ds)[:m]
        dq = np.zeros(m + 1, dtype=np.int64)
        hi = np.minimum(self.last[p:kmax + 1], kmax)
        ok = hi >= js + 1
        np.add.at(dq, (js + 1)[ok] - p, out[p:kmax + 1][ok])
        np.add.at(dq, hi[ok] + 1 - p, -out[p:kmax + 1][ok])
        q = np.cumsum(dq)[:m]
        own = na.own[p:kmax + 1]
        ow = np.concatenate(([0], np.cumsum(own)[:-1]))
        cur = na.cur[p:kmax + 1]
        fwd = self.open_fwd[p:kmax + 1] + cA_prev + cur
        bwd = cA + self.sinks_after[p + 1:kmax + 2] + na.gb[p:kmax + 1] + s + out[p:kmax + 1] * self.selfsave[p:kmax + 1] + ow + own
        bwd = np.where(self.rg[p:kmax + 1], bwd, NEG)
        rc = cA + self.sinks_after[p + 1:kmax + 2] + s + q + ow + cur
        return np.maximum.accumulate(fwd), bwd, rc, cA

    def _round_up(self, key: tuple[int, ...], opens: list[int], max_free: int) -> tuple[int, ...]:
        """``key`` with all but the ``max_free`` largest unheld open tensors counted as held."""
        free = [j for j in opens if j not in key]
        if len(free) <= max_free:
            return key
        keep = set(sorted(free, key=lambda j: -int(self.out[j]))[:max_free])
        return tuple(j for j in opens if j in key or j not in keep)

    # --------------------------------------------------------------- solve
    def solve(self, budget_bytes: int | None, *, objective: str = "flops",
              upper: int | None = None, time_limit_s: float | None = None,
              max_free: int | None = None) -> FrontierResult | None:
        """The optimum under ``budget_bytes`` (``objective="flops"``), or the
        least peak (``objective="peak"``; ``budget_bytes``, when given, caps
        the peaks considered); None when no interval plan fits.

        Args:
            upper: prune prefixes whose objective exceeds this (a known plan's).
            time_limit_s: raise :class:`FrontierTimeout` past this.
            max_free: a heuristic for wide graphs: at each boundary keep at
                most this many open tensors *not* held (the largest); count
                the others as held. Live bytes are then never under-counted,
                so the plan fits (``simulate`` checks it) but is optimal only
                among what that count allows; the patterns per boundary are
                bounded whatever the width. None: exact.
        """
        if objective not in ("flops", "peak"):
            raise ValueError(f"objective must be 'flops' or 'peak', not {objective!r}")
        t0 = time.perf_counter()
        peak = objective == "peak"
        n, out, lc, na = self.n, self.out, self.lc, self.na
        cap = (int(budget_bytes) - self.const) if budget_bytes is not None else (1 << 62)
        if peak and upper is not None:
            upper = int(upper) - self.const
        if cap < 0:
            return None
        # a_max[p]: a prefix with more A fails a later step whatever follows (plan-independent
        # lower bounds of the steps k >= p: forward copies awaiting consumers, gradients, sinks).
        sinkcum = na.p_sink  # sinkcum[k]: sinks before k
        total_sinks = int(sinkcum[-1])
        need = np.maximum(self.open_fwd + na.cur + sinkcum[:-1],
                          np.where(self.rg, na.gb + total_sinks, NEG))
        suffix = np.maximum.accumulate(need[::-1])[::-1]
        a_max = [int(cap + sinkcum[p] - suffix[p]) for p in range(n)] + [1 << 62]
        fronts = [_Front(peak) for _ in range(n + 1)]
        zero = np.zeros(1, dtype=np.int64)
        fronts[0].pending[()] = [(zero, zero, np.full(1, -1, dtype=np.int64), zero)]
        fronts[0].metas.append((-1, None, -1))
        states = 0
        sav = self.savers
        report = max(1, n // 10)
        for p in range(n):
            if p and p % report == 0:
                elapsed = time.perf_counter() - t0
                log.info("frontier %s: node %d of %d, %d states, %.1fs", self.graph.name, p, n, states, elapsed)
                # The fronts grow along the order: the whole run takes roughly (n/p)^2 times the time so far.
                if time_limit_s is not None and elapsed * (n / p) ** 2 > 1.5 * time_limit_s:
                    raise FrontierTimeout(f"the frontier program would need about {elapsed * (n / p) ** 2:.0f}s "
                                          f"(node {p} of {n} after {elapsed:.1f}s; limit {time_limit_s:g}s)")
            if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                raise FrontierTimeout(f"the frontier program reached node {p} of {n} in {time_limit_s:g}s")
            if p:
                fronts[p - 1].release()  # its entries were all extended
            fr = fronts[p]
            fr.settle(upper, a_max[p])
            if not fr.keys:
                continue
            states += sum(len(v[0]) for v in fr.keys.values())
            opens = self.opens[p]
            nxt_open = self.opens[p + 1]
            # ---- node p stored.
            for key, (a, o, *_rest) in fr.keys.items():
                held = set(key) | {j for j in opens if p in sav[j]}
                dA = int(na.own[p]) + sum(int(out[j]) for j in held if lc[j] == p) + (int(out[p]) if lc[p] < 0 else 0)
                fa = sum(int(out[j]) for j in held if lc[j] > p) + (int(out[p]) if lc[p] > p and self.selfsave[p] else 0)
                local = int(self.open_fwd[p] + na.cur[p])  # forward step: A before p
                if self.rg[p]:
                    local = max(local, int(dA + fa + self.sinks_after[p + 1] + na.gb[p]))
                cut = int(np.searchsorted(a, cap - local, side="right"))
                if cut:
                    nkey = tuple(j for j in nxt_open if j in held or (j == p and self.selfsave[p]))
                    if max_free is not None:
                        nkey = self._round_up(nkey, nxt_open, max_free)
                    fronts[p + 1].add(nkey, a, o, cut, dA, 0, local, (p, key, -1))
            # ---- a region [p, b].
            if not self.recomputable[p]:
                continue
            kmax = p
            while kmax + 1 < n and self.recomputable[kmax + 1]:
                kmax += 1
            endok = None  # which ends b of [p, b] are allowed: all, or (spans) a mask over [p, kmax]
            if self.span_ends is not None:
                allowed = self.span_ends[p]  # usable spans: all nodes recomputable, so <= kmax
                if not len(allowed):
                    continue
                kmax = int(allowed[-1])
                endok = np.zeros(kmax - p + 1, dtype=bool)
                endok[allowed - p] = True
            amin = min(int(v[0][0]) for v in fr.keys.values())
            fwdm, bwd, rc, cA = self._region_arrays(p, kmax)
            snap = self.pstate[p + 1:kmax + 2] - self.pstate[p]
            # Held through the whole recompute of [p, b]: the snapshots, and the extra bytes of span
            # (p, b) (eager lifetimes, NOTE [ Execution model ]); the latter left out of the bound lb.
            rc_held = snap.copy()
            for b, extra in self.span_extra_from[p]:
                if b <= kmax:
                    rc_held[b - p] += extra
            gr = na.gr[p:kmax + 1]
            # With no open tensor alive the local peak only grows with b (but for gr): it bounds the reach.
            lb = np.maximum(fwdm, np.maximum(np.maximum.accumulate(bwd), np.maximum.accumulate(rc) + snap))
            over = np.nonzero(lb > cap - amin)[0]
            m = int(over[0]) if len(over) else kmax - p + 1
            if m == 0:
                continue
            ks = np.arange(p, p + m)
            first_reader = {j: next((c for c in self.readers[j] if c >= p), _INF) for j in opens}
            bounds = sorted({p, p + m} | {f for j in opens if p < (f := first_reader[j]) < p + m})
            cost = self.pflops[p + 1:p + m + 1] - self.pflops[p]
            cache: dict[frozenset, tuple[np.ndarray, np.ndarray]] = {}
            nkeys: dict[tuple[frozenset, int], tuple[int, ...]] = {}

            def maxima(eff: frozenset):
                got = cache.get(eff)
                if got is None:
                    fa = np.zeros(m, dtype=np.int64)
                    for j in eff:
                        fa += out[j] * (ks < lc[j])
                    mono = np.maximum(fwdm[:m], np.maximum.accumulate(bwd[:m] + fa))
                    got = (mono, np.maximum(mono, np.maximum.accumulate(rc[:m] + fa) + gr[:m] + rc_held[:m]))
                    cache[eff] = got
                return got

            for key, (a, o, *_rest) in fr.keys.items():
                held = frozenset(key)
                room = cap - int(a[0])
                for lo, hi in zip(bounds[:-1], bounds[1:]):
                    eff = held | frozenset(j for j in opens if first_reader[j] <= lo)
                    mono, local = maxima(eff)
                    over = np.nonzero(mono[lo - p:hi - p] > room)[0]
                    end = lo + int(over[0]) if len(over) else hi  # mono grows with b: longer regions fail too
                    cuts = np.searchsorted(a, cap - local[lo - p:end - p], side="right")
                    if endok is not None:
                        cuts = cuts * endok[lo - p:end - p]
                    for off in np.nonzero(cuts)[0].tolist():
                        b = lo + off
                        i = b - p
                        nkey = nkeys.get((eff, b))
                        if nkey is None:
                            nkey = tuple(j for j in self.opens[b + 1] if j < p and j in eff)
                            if max_free is not None:
                                nkey = self._round_up(nkey, self.opens[b + 1], max_free)
                            nkeys[(eff, b)] = nkey
                        fronts[b + 1].add(nkey, a, o, int(cuts[off]), int(cA[i]), int(cost[i]), int(local[i]), (p, key, b))
                    if end < hi:
                        break
        last = fronts[n]
        last.settle(upper, a_max[n])
        if not last.keys:
            return None
        key = min(last.keys, key=lambda k: int(last.keys[k][1].min()))
        idx = int(np.argmin(last.keys[key][1]))
        best = int(last.keys[key][1][idx])
        regions = []
        pos = n
        while pos > 0:
            _, _, si, mi = fronts[pos].keys[key]
            src_pos, src_key, region_end = fronts[pos].metas[int(mi[idx])]
            if region_end >= 0:
                regions.append((src_pos, region_end))
            pos, key, idx = src_pos, src_key, int(si[idx])
        regions.reverse()
        value = best + self.const if peak else best
        log.info("frontier %s: %s %d over %d states in %.2fs", self.graph.name, objective, value, states,
                 time.perf_counter() - t0)
        return FrontierResult(tuple(regions), value, states, time.perf_counter() - t0)
