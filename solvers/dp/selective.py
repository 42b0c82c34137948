"""Selective recompute in ``dp``: the segment profile of a region that keeps nodes.

NOTE [ Kept nodes in the chain decomposition ]
    ``dp`` tries, for every region ``i..j`` it considers, each entry ``K`` of
    the region's menu (NOTE [ The menu of kept sets ] in ``solvers.model.selective``)
    as one more candidate segment. NOTE [ Selective recompute ] in
    ``solvers.model.simulate`` changes the region's segment (nodes ``a..b``) of NOTE
    [ Decomposing the simulated peak over a chain ] (``solvers.dp.profiles``) as
    follows; ``keep(k) = buf(k) + out(k)`` for a kept node that is no sink,
    ``buf(k)`` for a sink (the caller's copy is charged globally already):

    * forward step ``t`` of the region: ``+ buf(k)`` for kept ``k < t``, and
      ``+ out(k)`` for kept ``k`` no sink whose last consumer is before ``t``
      (the cache holds what the region would have freed);
    * recompute step ``t``: ``+ keep(k)`` for kept ``k > t`` (still cached);
      at a kept ``t`` no workspace (nothing runs; its bytes are the cached
      ones, already counted); ``- out(k)`` for kept sinks ``k <= t`` (the
      recomputed copy is the caller's storage);
    * backward step ``t``: ``- out(k)`` for kept sinks ``k`` whose first
      saver lies in the region at or before ``t`` (the same shared copy);
    * retained: ``+ sum keep(k)``: the cache holds them through every step of
      the segments to the right (all run before the region's recompute);
    * the boundary tensor leaving the region, when kept, is held by the
      region's cache, so the next segment is entered in state ``lh = 1``.

    Its cost is the region's cost less the kept nodes'. Everything else of the
    decomposition is unchanged, so the table stays exact on a chain, now over
    ``(region, menu entry)`` pairs.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from graphs import Graph

from .profiles import NEG, NodeArrays, region_rng, step_rows
from ..model.selective import DEFAULT_LIMIT, GrowingMenus, variants
from ..model.stages import Stages

__all__ = ["KeptRuns"]


class KeptRuns:
    """The region candidates with kept nodes, per first stage ``i`` (NOTE [ Kept nodes in the chain decomposition ]).

    Attributes:
        needs_lh1: per stage ``j``, a region ending there may keep the
            boundary tensor leaving it (then the set after ``j`` entered in
            state 1 is needed).
    """

    def __init__(self, graph: Graph, na: NodeArrays, st: Stages, lh_reg: Sequence[int], bnd_out: Sequence[int],
                 span_extra: Mapping[tuple[int, int], int], *, limit: int = DEFAULT_LIMIT) -> None:
        self.graph, self.na, self.st, self.limit = graph, na, st, limit
        self.lh_reg, self.bnd_out, self.span_extra = lh_reg, bnd_out, span_extra
        self.costs = graph.recompute_costs()
        self.saveable = graph.saveable
        cand = [s and c > 0 for s, c in zip(self.saveable, self.costs)]
        self._pc = np.concatenate(([0], np.cumsum(cand))).astype(np.int64)
        self._pst = np.concatenate(([0], np.cumsum(na.state))).astype(np.int64)
        self._bnd_in = np.array(st.boundary if st.boundary else [s - 1 for s in st.starts], dtype=np.int64)
        self._menus = GrowingMenus(graph, limit=limit, costs=self.costs)  # variants(), for growing regions
        self.needs_lh1 = [bool(st.regionable[j]) and not lh_reg[j] and cand[bnd_out[j]] for j in range(len(st))]

    @property
    def any(self) -> bool:
        """Some node can be kept at all."""
        return bool(self._pc[-1])

    def entry(self, i: int, j: int, v: int) -> tuple[tuple[int, ...], int]:
        """``(kept nodes, state the next stage is entered in)`` of region ``i..j`` keeping menu entry ``v``
        (computed again when a plan is read out: nothing per region is stored, NOTE [ Linear memory in dp ])."""
        a, b = self.st.starts[i], self.st.ends[j]
        kept = variants(self.graph, a, b, limit=self.limit, costs=self.costs, saveable=self.saveable)[v]
        return kept, self._lh(j, kept)

    def _lh(self, j: int, kept: tuple[int, ...]) -> int:
        return 1 if self.lh_reg[j] or self.bnd_out[j] in kept else 0

    def runs(self, i: int, js: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, ...]:
        """The extra runs of regions starting at stage ``i``: one per region
        ``i..j`` (``j`` in ``js``) and menu entry ``v >= 1``.

        Args:
            i: the first stage.
            js: the last stages considered (as for the plain regions).
            cost: the recompute cost of each region ``i..j``, aligned with ``js``.

        Returns:
            ``(segs, floor, run_cost, ret, choice)`` for ``merge_stage``: the
            set following each run is ``j`` (state ``lh_reg[j]``) or ``m + j``
            (state 1); ``choice = j + m * v``.
        """
        m = len(self.st)
        st, na = self.st, self.na
        a = st.starts[i]
        out: list[tuple[int, int, int, int, int]] = []
        rows = None
        for j, region_cost in zip(js.tolist(), cost.tolist()):
            b = st.ends[j]
            if self._pc[b + 1] == self._pc[a]:
                continue
            menu = self._menus.of(a, b)
            if len(menu) == 1:
                continue
            if rows is None:
                f, rc, bw = step_rows(na, np.array([a], dtype=np.int64), self._bnd_in[i:i + 1])
                rows = (f[0], rc[0], bw[0])
            for v in range(1, len(menu)):
                floor, ret = self._profile(rows, i, j, menu[v])
                lh = self._lh(j, menu[v])
                seg = j if lh == self.lh_reg[j] else m + j
                saved_cost = sum(self.costs[k] for k in menu[v])
                out.append((seg, floor, int(region_cost) - saved_cost, ret, j + m * v))
        if not out:
            e = np.zeros(0, np.int64)
            return e, e, e, e, e
        cols = np.array(out, dtype=np.int64).T
        return tuple(np.ascontiguousarray(c) for c in cols)

    def _profile(self, rows: tuple[np.ndarray, np.ndarray, np.ndarray], i: int, j: int,
                 kept: tuple[int, ...]) -> tuple[int, int]:
        """``(local peak without the input, retained bytes)`` of region ``i..j`` keeping ``kept``."""
        st, na = self.st, self.na
        a, b = st.starts[i], st.ends[j]
        size = b - a + 1
        k = np.array(kept, dtype=np.int64)
        t = k - a
        out, buf, sink, lc = na.out[k], na.buf[k], na.sink[k], na.lc[k]
        keep = buf + np.where(sink, 0, out)
        df = np.zeros(size + 1, np.int64)
        dr = np.zeros(size + 1, np.int64)
        np.add.at(df, t + 1, buf)  # the cache holds the buffers after k's forward step...
        late = ~sink & (lc < b)
        np.add.at(df, lc[late] - a + 1, out[late])  # ...and the output after its last consumer
        dr[0] = keep.sum()  # cached until the recompute reaches k
        np.add.at(dr, t, -keep - np.where(sink, out, 0))  # a sink's recomputed copy is the caller's
        f = rows[0][a:b + 1] + np.cumsum(df)[:size]
        rc = rows[1][a:b + 1] + np.cumsum(dr)[:size]
        rc[t] -= na.ws[k]  # nothing runs at k
        bw = rows[2][a:b + 1]
        shared = sink & (na.fs[k] <= b)
        if shared.any():  # the shared copy is saved for the backward (the rows count it from its first saver on)
            db = np.zeros(size + 1, np.int64)
            np.add.at(db, na.fs[k][shared] - a, -out[shared])
            bw = np.where(bw > NEG, bw + np.cumsum(db)[:size], NEG)
        sinks = int(na.p_sink[-1])
        snapshot = int(self._pst[b + 1] - self._pst[a]) + int(self.span_extra.get((a, b), 0))
        rng = int(region_rng(na, a, b))  # NOTE [ RNG state per region ]: held throughout, twice in the recompute
        local = max(int(f.max()) + rng, int(rc.max()) + sinks + int(na.gr[b]) + snapshot + 2 * rng)
        bm = int(bw.max())
        if bm > NEG:
            local = max(local, bm + sinks + rng)
        return local, int(keep.sum()) + rng
