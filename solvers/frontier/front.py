"""The frontier program's bookkeeping (NOTE [ The frontier DP ] in ``solvers.frontier.program``).

The Pareto fronts it keeps per boundary and bit pattern, the open tensors
that make its bits (and the width that bounds their number), and the read-out
of a plan by the fronts' back pointers: the steps a kept region, a nested
region or a block leaves (read by ``kept``, ``nested`` and ``solvers.blocks``),
and the held bytes they share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphs import CkptError, Graph

from ..model.terms import terms_of

__all__ = ["Front", "pareto", "open_counts", "width", "TooWide", "trace_back", "round_up", "KeptStep", "BlockStep",
           "NestedStep", "HeldBytes"]


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
    the step did: a region's last node, -1 for a stored node, a ``KeptStep``
    for a region keeping nodes, or a ``BlockStep`` for a block's plan). Arriving entries stay *lazy* (a slice of
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


# ------------------------------------------------------------ open tensors
class TooWide(CkptError, ValueError):
    """The graph has more open tensors at some position than the program allows.

    Attributes:
        width: the most tensors (of non-zero bytes) open at one boundary.
        max_width: the limit.
        position: a boundary where ``width`` tensors are open.
    """

    def __init__(self, width: int, max_width: int, position: int, *, prefix: str = "",
                 advice: str = "solve with 'ilp' or 'cp-sat', which take any graph") -> None:
        super().__init__(f"{prefix}{width} tensors are open at one position (before node {position}), more than the "
                         f"frontier program's max_width {max_width} (its states grow as 2**width); {advice}")
        self.width, self.max_width, self.position = width, max_width, position


def open_counts(out: np.ndarray, lc: np.ndarray) -> np.ndarray:
    """``counts[p]``: tensors of non-zero bytes with ``j < p <= lc[j]``, for ``p`` in ``0..n`` (linear time)."""
    n = len(lc)
    j = np.arange(n)
    live = (lc > j) & (out > 0)
    d = np.zeros(n + 2, dtype=np.int64)
    np.add.at(d, j[live] + 1, 1)
    np.add.at(d, lc[live] + 1, -1)
    return np.cumsum(d)[:n + 1]


def _open_sets(out: np.ndarray, lc: np.ndarray) -> list[list[int]]:
    """``opens[p]``: tensors of non-zero bytes with ``j < p <= lc[j]`` (open at the boundary before ``p``),
    ascending: a front's key lists the held ones in this order. Built with numpy: the lists hold
    ``sum(open_counts)`` entries, millions on a wide graph (a loop of appends took 10 s on a 5,000-node DAG with
    1,264 tensors open at one boundary; the caller checks its deadline against :func:`open_entries` first)."""
    n = len(lc)
    js = np.nonzero((lc > np.arange(n)) & (out > 0))[0].astype(np.int64)
    lengths = lc[js] - js
    total = int(lengths.sum())
    if total == 0:
        return [[] for _ in range(n + 1)]
    owner = np.repeat(js, lengths)  # ascending in j
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = owner + 1 + (np.arange(total, dtype=np.int64) - first)
    owner = owner[np.argsort(pos, kind="stable")]  # by position, each position's tensors still ascending
    bounds = np.cumsum(np.bincount(pos, minlength=n + 1))[:-1]
    return [part.tolist() for part in np.split(owner, bounds)]


def open_entries(out: np.ndarray, lc: np.ndarray) -> int:
    """How many entries :func:`_open_sets` holds (linear time): the work of building the program's open sets."""
    return int(open_counts(out, lc).sum())


def width(graph: Graph) -> int:
    """The most tensors of non-zero bytes open at any boundary of the topological order (linear time),
    leaving out those the caller holds to the end (no bit: NOTE [ The frontier DP ])."""
    held = terms_of(graph).sinks
    out = np.array([0 if held[k] else nd.out_bytes for k, nd in enumerate(graph.nodes)], dtype=np.int64)
    lc = np.array([max(s) if s else -1 for s in graph.succs], dtype=np.int64)
    return int(open_counts(out, lc).max())


# ---------------------------------------------------------------- read-out
def trace_back(fronts: list[Front], n: int, key: tuple[int, ...], idx: int, *,
               nested: list | None = None) -> tuple[tuple, tuple[int, ...]]:
    """The plan of entry ``idx`` of key ``key`` at boundary ``n``, by its back pointers.

    Args:
        nested: where given, the nested regions (NOTE [ Nested regions in the frontier DP ]) are appended to it.

    Returns:
        ``(regions, saved)``: the regions in order, and the kept nodes (sorted).
    """
    regions: list[tuple[int, int]] = []
    saved: list[int] = []
    pos = n
    while pos > 0:
        _, _, si, mi = fronts[pos].keys[key]
        src_pos, src_key, step = fronts[pos].metas[int(mi[idx])]
        if isinstance(step, KeptStep):
            regions.append((src_pos, step.last))
            saved.extend(step.kept)
        elif isinstance(step, NestedStep):
            regions.append((src_pos, step.last))
            if nested is not None:
                nested.append((src_pos, step.last))
        elif isinstance(step, BlockStep):  # a block's plan
            regions.extend(reversed(step.regions))
            saved.extend(step.saved)
        elif step >= 0:
            regions.append((src_pos, step))
        pos, key, idx = src_pos, src_key, int(si[idx])
    regions.reverse()
    return tuple(regions), tuple(sorted(saved))


def round_up(key: tuple[int, ...], opens: list[int], max_free: int, out: np.ndarray) -> tuple[int, ...]:
    """``key`` with all but the ``max_free`` largest unheld open tensors (bytes ``out``) counted as held."""
    free = [j for j in opens if j not in key]
    if len(free) <= max_free:
        return key
    keep = set(sorted(free, key=lambda j: -int(out[j]))[:max_free])
    return tuple(j for j in opens if j in key or j not in keep)


# ------------------------------------------------------------------ the back pointers a step leaves
@dataclass(frozen=True)
class KeptStep:
    """The back pointer of a region that keeps nodes: its last node and the kept nodes."""

    last: int
    kept: tuple[int, ...]


@dataclass(frozen=True)
class BlockStep:
    """The back pointer of a block crossed by its front (NOTE [ Composing repeated blocks ]): its regions
    and kept nodes."""

    regions: tuple[tuple[int, int], ...]
    saved: tuple[int, ...] = ()


@dataclass(frozen=True)
class NestedStep:
    """The back pointer of a nested region: its last node (its inner regions are its menu)."""

    last: int


class HeldBytes:
    """Per set of held open tensors, their bytes at each of the ``m`` steps from ``p``, computed once."""

    def __init__(self, prog: Any, p: int, m: int) -> None:
        self.prog, self.ks, self.m = prog, np.arange(p, p + m), m
        self._got: dict[frozenset, np.ndarray] = {}

    def of(self, eff: frozenset) -> np.ndarray:
        got = self._got.get(eff)
        if got is None:
            self.prog.count(steps=1, elements=self.m)
            got = np.zeros(self.m, np.int64)
            for j in eff:
                got += self.prog.out[j] * (self.ks < self.prog.lc[j])
            self._got[eff] = got
        return got
