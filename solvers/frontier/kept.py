"""Selective recompute in the frontier program: regions that keep some nodes.

NOTE [ Kept nodes in the frontier DP ]
    With ``selective`` the frontier program (NOTE [ The frontier DP ] in
    ``solvers.frontier.program``) extends a front by every region ``[p, b]`` once per
    entry ``K`` of the region's menu (NOTE [ The menu of kept sets ] in
    ``solvers.model.selective``), so its optimum is over ``(region, menu entry)``
    pairs: the same set the brute force and ``dp`` search. Keeping ``K``
    (NOTE [ Selective recompute ] in ``solvers.model.simulate``) changes the
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
    decomposition ] in ``solvers.dp.selective``), written on the program's
    step rows. Keeping may lower a region's recompute and backward peak
    (workspace, shared sinks) but never its forward steps, so the ends
    ``b`` tried are bounded by the forward peak alone, which only grows
    with ``b``. A chain of repeated blocks is composed with kept nodes too:
    a block's own front (``solvers.blocks.front``) tries the same entries with
    the same terms (:meth:`KeptRegions.entries`), and a block's signature
    then holds what keeping each node does (NOTE [ Composing repeated
    blocks ]); a region's menu is the same in every copy of a block, its
    ranking by cost and bytes and ties broken by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dp.profiles import NEG
from ..model.terms import INF
from ..model.selective import DEFAULT_LIMIT, GrowingMenus
from .front import HeldBytes, KeptStep, round_up

__all__ = ["KeptEntry", "KeptRegions", "extend_variants"]


class KeptRegions:
    """The menu entries of every region of one program, and what each does to a step.

    Args:
        program: the :class:`~solvers.frontier.program.FrontierDP` of the graph.
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

    def entries(self, p: int, b: int, terms: tuple) -> list[KeptEntry]:
        """The non-empty entries of region ``[p, b]``'s menu, each with its bit-independent terms.

        Args:
            p, b: the region (``b`` may only grow for one ``p``, as ``GrowingMenus`` asks).
            terms: ``program.region_terms(p, kmax)``, ``kmax >= b``.
        """
        _, bwd, rc, cA, _, gr, cost, held_b, fwd, rng = terms
        size = b - p + 1
        r = int(rng[size - 1])  # the generator state of a stochastic [p, b], at every step
        out = []
        for kept in self.menus.of(p, b)[1:]:
            df, dr, db, dA, saved_cost, held = self.deltas(p, b, kept)
            bw = bwd[:size]
            out.append(KeptEntry(kept, int((fwd[:size] + df).max()) + r, np.where(bw > NEG, bw + db, NEG),
                                 rc[:size] + dr, int(gr[size - 1]) + int(held_b[size - 1]), r,
                                 int(cA[size - 1]) + dA, int(cost[size - 1]) - saved_cost, held))
        return out

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
            max_free: as for :meth:`~solvers.frontier.program.FrontierDP.solve`.
        """
        extend_variants(self.prog, p, fr, fronts, terms, cap, endok, max_free,
                        lambda b: self.entries(p, b, terms), lambda b, ent: KeptStep(b, ent.kept))


def extend_variants(prog: Any, p: int, fr: Any, fronts: list, terms: tuple, cap: int, endok: np.ndarray | None,
                    max_free: int | None, entries_at: Any, step_of: Any) -> None:
    """Carry the front ``fr`` at ``p`` over every variant of every region ``[p, b]`` that fits: the regions that
    keep a menu entry (:class:`KeptRegions`) and the nested ones (``solvers.frontier.nested``).

    A variant's forward steps are never below the plain region's, so the ends ``b`` tried stop where the plain
    forward peak (which only grows with ``b``) leaves no room.

    Args:
        prog: the :class:`~solvers.frontier.program.FrontierDP`; the rest as :meth:`KeptRegions.extend`.
        entries_at: ``entries_at(b)``: the variants of ``[p, b]``, each with ``f``, ``back(fa)``,
            ``exit_key(prog, p, b, eff)``, ``dA`` and ``cost`` (:class:`KeptEntry`).
        step_of: ``step_of(b, entry)``: the back pointer of the variant (NOTE [ The frontier DP ]).
    """

    fwdm = terms[0]
    amin = min(int(v[0][0]) for v in fr.keys.values())
    over = np.nonzero(fwdm > cap - amin)[0]
    m = int(over[0]) if len(over) else len(fwdm)
    first_reader = {j: next((c for c in prog.readers[j] if c >= p), INF) for j in prog.opens[p]}
    fas = HeldBytes(prog, p, m)
    for b in range(p, p + m):
        if endok is not None and not endok[b - p]:
            continue
        entries = entries_at(b)
        if not entries:
            continue
        size = b - p + 1
        read = frozenset(j for j in prog.opens[p] if first_reader[j] <= b)
        effs = {key: frozenset(key) | read for key in fr.keys}
        for ent in entries:
            nkeys: dict[frozenset, tuple[int, ...]] = {}
            for key, (a, o, *_rest) in fr.keys.items():
                eff = effs[key]
                local = max(ent.f, ent.back(fas.of(eff)[:size]))
                cut = int(np.searchsorted(a, cap - local, side="right"))
                prog.count(steps=1, elements=size, entries=cut)
                if not cut:
                    continue
                nkey = nkeys.get(eff)
                if nkey is None:
                    nkey = ent.exit_key(prog, p, b, eff)
                    if max_free is not None:
                        nkey = round_up(nkey, prog.opens[b + 1], max_free, prog.out)
                    nkeys[eff] = nkey
                fronts[b + 1].add(nkey, a, o, cut, ent.dA, ent.cost, local, (p, key, step_of(b, ent)))


@dataclass(frozen=True)
class KeptEntry:
    """One non-empty menu entry of a region ``[p, b]``: what it keeps and its terms, bit-independent.

    Attributes:
        kept: the kept nodes.
        f: the largest live bytes of its forward steps, less the retained bytes before the region.
        bw, rk: its backward and recompute steps (per node of the region), without held open tensors.
        tail: what its recompute steps add at the region's end (gradients, snapshots, span extras).
        rng: the generator state it stores.
        dA: what joins the retained bytes after it.
        cost: its recompute cost.
        held: the kept nodes still read after ``b`` (held open tensors from then on).
    """

    kept: tuple[int, ...]
    f: int
    bw: np.ndarray
    rk: np.ndarray
    tail: int
    rng: int
    dA: int
    cost: int
    held: frozenset

    def back(self, fa: np.ndarray) -> int:
        """The largest live bytes of its recompute and backward steps, less the retained bytes before the
        region, where ``fa`` are the held open tensors' bytes at each of its steps."""
        return max(int((self.bw + fa).max()) + self.rng, int((self.rk + fa).max()) + self.tail)

    def exit_key(self, prog: Any, p: int, b: int, eff: frozenset) -> tuple[int, ...]:
        """The held open tensors after the region, entered with ``eff`` held or read."""
        return tuple(j for j in prog.opens[b + 1] if (j < p and j in eff) or j in self.held)
