"""What a region costs at a position of the frontier program (NOTE [ The frontier DP ] in
``solvers.frontier.program``): the bit-independent terms of the regions that start there, their maxima for a
set of held open tensors, and the open tensors they read. ``FrontierDP`` has them; ``kept``, ``nested`` and
``solvers.blocks`` read them through it.
"""

from __future__ import annotations

import numpy as np

from ..dp.profiles import NEG
from ..model.terms import INF

__all__ = ["RegionTerms"]


class RegionTerms:
    """The region terms of :class:`~solvers.frontier.program.FrontierDP` (which sets the arrays they read)."""

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
        dA += out[p:kmax + 1] * self.sink[p:kmax + 1]  # held by the caller from its forward step
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
        return fwd, bwd, rc, cA

    def region_terms(self, p: int, kmax: int) -> tuple:
        """The bit-independent arrays of regions ``[p, b]``, ``b <= kmax``:
        ``(fwdm, bwd, rc, cA, snap, gr, cost, held, fwd, rng)``, indexed by ``b - p``; ``held``
        is what the whole recompute of ``[p, b]`` holds: the snapshots, and the
        extra bytes of span ``(p, b)`` (eager lifetimes, NOTE [ Execution model ]),
        which the reach bound leaves out (it stays monotone in ``b``); ``fwd`` the
        forward steps one by one (``fwdm`` their running maximum, plus ``rng``); ``rng`` the
        generator state region ``[p, b]`` stores, already in ``fwdm``, ``cA``, ``snap`` and ``held``."""
        fwd, bwd, rc, cA = self._region_arrays(p, kmax)
        snap = self.pstate[p + 1:kmax + 2] - self.pstate[p]
        held = snap.copy()
        for b, extra in self.span_extra_from[p]:
            if b <= kmax:
                held[b - p] += extra
        fwdm = np.maximum.accumulate(fwd)
        # The generator state a stochastic [p, b] stores: held at all its steps and retained with its
        # inputs; once more (fork_rng's copy) while it recomputes. Grows with b, like the reach.
        rng = self.rng * ((self.pstoch[p + 1:kmax + 2] - self.pstoch[p]) > 0)
        if self.rng:
            fwdm = fwdm + rng
            cA = cA + rng
            snap = snap + 2 * rng
            held = held + 2 * rng
        return (fwdm, bwd, rc, cA, snap, self.na.gr[p:kmax + 1],
                self.pflops[p + 1:kmax + 2] - self.pflops[p] + self.call, held, fwd, rng)

    def region_maxima(self, terms: tuple, eff: frozenset, p: int, m: int):
        """``(lf, lb, mono)`` of regions ``[p, p + i]``, ``i < m``, whose held open tensors are ``eff``:
        the largest live bytes less the retained bytes before the region in
        its forward steps (``lf``) and in its recompute and backward steps
        (``lb``), and ``max(lf, backward steps)``, which only grows with the region."""
        fwdm, bwd, rc, _, _, gr, _, held, _, rng = terms
        ks = np.arange(p, p + m)
        fa = np.zeros(m, dtype=np.int64)
        for j in eff:
            fa += self.out[j] * (ks < self.lc[j])
        lbw = np.maximum.accumulate(bwd[:m] + fa) + rng[:m]
        lb = np.maximum(lbw, np.maximum.accumulate(rc[:m] + fa) + gr[:m] + held[:m])
        return fwdm[:m], lb, np.maximum(fwdm[:m], lbw)

    def reader_bounds(self, p: int, m: int) -> tuple[dict[int, int], list[int]]:
        """The first reader at or after ``p`` of each open tensor, and the ends
        ``p + i`` (``i < m``) where the set of open tensors a region reads grows."""
        first_reader = {j: next((c for c in self.readers[j] if c >= p), INF) for j in self.opens[p]}
        bounds = sorted({p, p + m} | {f for f in first_reader.values() if p < f < p + m})
        return first_reader, bounds

    def region_nkey(self, eff: frozenset, p: int, b: int) -> tuple[int, ...]:
        """The held open tensors after a region ``[p, b]`` that read (or held) ``eff``."""
        return tuple(j for j in self.opens[b + 1] if j < p and j in eff)
