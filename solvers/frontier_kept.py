"""Selective recompute in the frontier program: regions that keep some nodes.

NOTE [ Kept nodes in the frontier DP ]
    With ``selective`` the frontier program (NOTE [ The frontier DP ] in
    ``solvers.frontier``) extends a front by every region ``[p, b]`` once per
    entry ``K`` of the region's menu (NOTE [ The menu of kept sets ] in
    ``solvers.selective``), so its optimum is over ``(region, menu entry)``
    pairs: the same set the brute force and ``dp`` search. Keeping ``K``
    (NOTE [ Selective recompute ] in ``solvers.simulate``) changes the
    region's step as follows; ``keep(k) = buf(k) + out(k)`` for a kept ``k``
    that is no sink, ``buf(k)`` for a sink (whose output every step already
    counts: sinks join the retained bytes when produced):

    * forward step ``t`` of the region: ``+ buf(k)`` for kept ``k < t``, and
      ``+ out(k)`` for kept ``k`` (no sink) whose last consumer is before
      ``t`` (the cache holds what the region would have freed; while ``k``
      still awaits a consumer its copy is an open tensor, counted already);
    * recompute step ``t``: ``+ keep(k)`` for kept ``k > t`` (still cached),
      no workspace at a kept ``t`` (nothing runs), ``- out(k)`` for kept
      sinks ``k <= t`` (the recomputed copy is the caller's storage);
    * backward step ``t``: ``- out(k)`` for kept sinks ``k`` whose first
      saver lies in the region at or before ``t`` (the same shared storage);
    * what joins the retained bytes ``A`` after the region: the region's own
      share, plus ``buf(k)`` of every kept ``k`` and ``out(k)`` of every kept
      ``k`` (no sink) whose readers all lie in the region;
    * a kept ``k`` still read after ``b`` leaves the region *held* (its bit
      is set): the cache keeps it past its last reader, so it joins ``A``
      when it closes, like any held open tensor.

    Its cost is the region's less the kept nodes'. These terms are the ones
    ``dp`` adds to its chain segments (NOTE [ Kept nodes in the chain
    decomposition ] in ``solvers.dp_selective``), written on the program's
    step rows. Keeping may lower a region's recompute and backward peak
    (workspace, shared sinks) but never its forward steps, so the ends
    ``b`` tried are bounded by the forward peak alone, which only grows
    with ``b``. Chains of repeated blocks are not composed under
    ``selective`` (their fronts know no kept sets): every node is walked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .dp_model import NEG
from .terms import INF
from .selective import DEFAULT_LIMIT, GrowingMenus

__all__ = ["KeptStep", "KeptRegions"]


@dataclass(frozen=True)
class KeptStep:
    """The back pointer of a region that keeps nodes: its last node and the kept nodes."""

    last: int
    kept: tuple[int, ...]


class KeptRegions:
    """The menu entries of every region of one program, and what each does to a step.

    Args:
        program: the :class:`~solvers.frontier.FrontierDP` of the graph.
        limit: the menus' size (NOTE [ The menu of kept sets ]).
    """

    def __init__(self, program: Any, *, limit: int = DEFAULT_LIMIT) -> None:
        self.prog = program
        self.costs = program.graph.recompute_costs()
        self.menus = GrowingMenus(program.graph, limit=limit, costs=self.costs)

    @property
    def any(self) -> bool:
        """Some node may be kept at all (saveable, of positive cost)."""
        return bool(self.menus.rank)

    def deltas(self, p: int, b: int, kept: tuple[int, ...]) -> tuple:
        """What keeping ``kept`` does to region ``[p, b]`` (NOTE [ Kept nodes in the frontier DP ]).

        Returns:
            ``(df, dr, db, dA, saved_cost, held)``: per step of the region the
            bytes added to its forward, recompute and backward steps, what
            joins ``A`` after it, the cost not recomputed, and the kept
            nodes still read after ``b`` (held open tensors from then on).
        """
        na = self.prog.na
        size = b - p + 1
        k = np.array(kept, dtype=np.int64)
        t = k - p
        out, buf, sink, lc = na.out[k], na.buf[k], na.sink[k], na.lc[k]
        keep = buf + np.where(sink, 0, out)
        closed = ~sink & (lc <= b)
        df = np.zeros(size + 1, np.int64)
        np.add.at(df, t + 1, buf)
        np.add.at(df, lc[closed] - p + 1, out[closed])
        dr = np.zeros(size + 1, np.int64)
        dr[0] = keep.sum()
        np.add.at(dr, t, -keep - np.where(sink, out, 0))
        dr = np.cumsum(dr)[:size]
        dr[t] -= na.ws[k]
        db = np.zeros(size + 1, np.int64)
        shared = sink & (na.fs[k] <= b)  # a kept sink's copy is the caller's, saved for the backward from fs on
        np.add.at(db, na.fs[k][shared] - p, -out[shared])
        dA = int(buf.sum() + out[closed].sum())
        held = frozenset(int(j) for j in k[~sink & (lc > b) & (out > 0)])
        saved_cost = sum(self.costs[j] for j in kept)
        return np.cumsum(df)[:size], dr, np.cumsum(db)[:size], dA, saved_cost, held

    def extend(self, p: int, fr: Any, fronts: list, terms: tuple, cap: int, endok: np.ndarray | None,
               max_free: int | None) -> None:
        """Carry the front ``fr`` at ``p`` over every region ``[p, b]`` that keeps a menu entry.

        Args:
            p: the region's first node.
            fr: the front at ``p`` (settled).
            fronts: every boundary's front (regions ending at ``b`` arrive at ``b + 1``).
            terms: ``program.region_terms(p, kmax)``.
            cap: the budget less the bytes alive at every step.
            endok: which ends are allowed (spans), or None for all.
            max_free: as for :meth:`~solvers.frontier.FrontierDP.solve`.
        """
        from .frontier_front import round_up  # frontier_front imports this module

        prog = self.prog
        fwdm, bwd, rc, cA, _, gr, cost, held_b, fwd, rng = terms
        amin = min(int(v[0][0]) for v in fr.keys.values())
        over = np.nonzero(fwdm > cap - amin)[0]
        m = int(over[0]) if len(over) else len(fwdm)
        first_reader = {j: next((c for c in prog.readers[j] if c >= p), INF) for j in prog.opens[p]}
        opens_p = prog.opens[p]
        ks = np.arange(p, p + m)
        fas: dict[frozenset, np.ndarray] = {}  # per held open tensors: their bytes at each step of the region
        for b in range(p, p + m):
            menu = self.menus.of(p, b)  # b grows for one p, as GrowingMenus asks
            if len(menu) == 1 or (endok is not None and not endok[b - p]):
                continue
            size = b - p + 1
            read = frozenset(j for j in opens_p if first_reader[j] <= b)
            effs = {key: frozenset(key) | read for key in fr.keys}
            for eff in set(effs.values()) - set(fas):
                fa = np.zeros(m, np.int64)
                for j in eff:
                    fa += prog.out[j] * (ks < prog.lc[j])
                fas[eff] = fa
            for kept in menu[1:]:
                df, dr, db, dA, saved_cost, held = self.deltas(p, b, kept)
                r = int(rng[size - 1])  # the generator state of a stochastic [p, b], at every step
                f = int((fwd[:size] + df).max()) + r
                bw = bwd[:size]
                bw = np.where(bw > NEG, bw + db, NEG)
                rk = rc[:size] + dr
                tail = int(gr[size - 1]) + int(held_b[size - 1])
                nkeys: dict[frozenset, tuple[int, ...]] = {}
                for key, (a, o, *_rest) in fr.keys.items():
                    eff = effs[key]
                    fa = fas[eff][:size]
                    local = max(f, int((bw + fa).max()) + r, int((rk + fa).max()) + tail)
                    cut = int(np.searchsorted(a, cap - local, side="right"))
                    if not cut:
                        continue
                    nkey = nkeys.get(eff)
                    if nkey is None:
                        nkey = tuple(j for j in prog.opens[b + 1] if (j < p and j in eff) or j in held)
                        if max_free is not None:
                            nkey = round_up(nkey, prog.opens[b + 1], max_free, prog.out)
                        nkeys[eff] = nkey
                    fronts[b + 1].add(nkey, a, o, cut, int(cA[size - 1]) + dA, int(cost[size - 1]) - saved_cost,
                                      local, (p, key, KeptStep(b, kept)))
