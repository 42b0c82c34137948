"""The Pareto fronts the frontier program keeps per boundary and bit pattern (NOTE [ The frontier DP ])."""

from __future__ import annotations

import numpy as np

__all__ = ["Front", "pareto"]


def pareto(a, o, si, mi):
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


class Front:
    """Pareto fronts ``(A, objective)`` with back pointers, per bit pattern, at one boundary.

    An entry points back to its source entry (``si``, an index into the
    source front) and to ``metas[mi]``: (source boundary, source key, what
    the step did: a region's last node, -1 for a stored node, or a tuple of
    regions for a block's plan). Arriving entries stay *lazy* (a slice of
    the source front and the step's shifts) until the boundary is reached
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
        """Entries ``[:cut]`` of a source front ``(a, o)``, carried over one step."""
        self.metas.append(meta)
        chunks = self.pending.setdefault(key, [])
        chunks.append((a, o, cut, shift_a, shift_o, local, len(self.metas) - 1))
        if len(chunks) >= self.COMPACT:
            self.pending[key] = [pareto(*self._build(chunks))]

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
                self.keys[key] = pareto(a, o, si, mi)
        self.pending = {}

    def release(self) -> None:
        """Keep only the back pointers once the boundary is processed."""
        self.keys = {k: (None, None, v[2], v[3]) for k, v in self.keys.items()}
