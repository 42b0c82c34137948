"""One block's Pareto front: its plans summed up as the chain needs them.

NOTE [ Composing repeated blocks ] in ``solvers.blocks.compose`` says what a plan of
a block is summed up by: ``(dA, cost, lf, lb)`` per entry key and exit key.
This walks the block's nodes with the frontier program's own steps
(``FrontierDP.stored_step``, ``region_terms``, ``region_maxima``: one memory
model) and no budget, keeping at each boundary and key the entries that no
other beats in all four numbers (a later step adds ``dA`` and takes maxima,
so a beaten entry never wins later). Regions are the block's spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphs import CkptError

from ..dp.profiles import NEG
from ..frontier.front import HeldBytes

__all__ = ["BlockPlans", "BlockFrontTooLarge", "block_front", "MAX_PLANS"]

#: Most plans kept at one boundary and key of a block before the composition gives up.
MAX_PLANS = 20_000

Regions = tuple[tuple[int, int], ...]


class BlockFrontTooLarge(CkptError):
    """A block's front grew past :data:`MAX_PLANS` plans at one boundary.

    Attributes:
        plans: how many it reached.
        node: the boundary (node position).
    """

    def __init__(self, plans: int, node: int) -> None:
        super().__init__(f"a block's front holds {plans} plans before node {node} (limit {MAX_PLANS})")
        self.plans, self.node = plans, node


@dataclass(frozen=True)
class BlockPlans:
    """The plans of a block that leave it with one exit key.

    Attributes:
        exit: the exit key, as descriptors (``solvers.blocks.compose.Block.exit``).
        dA: bytes each plan adds to the retained bytes.
        cost: its recompute FLOPs.
        lf: its largest forward live bytes less the entry's retained bytes.
        lb: the same over its recompute and backward steps (of the reference copy).
        regions: its regions, relative to the block's first node.
        saved: the nodes it keeps (selective recompute), relative to the block's first node.
    """

    exit: tuple[tuple[str, int], ...]
    dA: np.ndarray
    cost: np.ndarray
    lf: np.ndarray
    lb: np.ndarray
    regions: tuple[Regions, ...]
    saved: tuple[tuple[int, ...], ...]


def _prune(chunks: list[tuple]) -> tuple:
    """The entries of ``chunks`` that no other entry beats in all of (dA, cost, lf, lb)."""
    dA, cost, lf, lb = (np.concatenate([c[i] for c in chunks]) for i in range(4))
    regs = [r for c in chunks for r in c[4]]
    order = np.lexsort((lb, lf, cost, dA))  # earlier entries can beat later ones, never the reverse
    kc, kf, kb, kept = np.empty(len(order), np.int64), np.empty(len(order), np.int64), np.empty(len(order), np.int64), []
    for i in order.tolist():
        t = len(kept)
        if t and np.any((kc[:t] <= cost[i]) & (kf[:t] <= lf[i]) & (kb[:t] <= lb[i])):
            continue
        kc[t], kf[t], kb[t] = cost[i], lf[i], lb[i]
        kept.append(i)
    idx = np.array(kept, dtype=np.int64)
    return dA[idx], cost[idx], lf[idx], lb[idx], [regs[i] for i in kept]


def block_front(prog: Any, s: int, e: int, key: tuple[int, ...]) -> dict[tuple[int, ...], tuple]:
    """The Pareto front of block ``[s, e]`` of ``prog`` entered with the open tensors ``key`` held.

    With kept nodes (the program's ``kept``), every region that is a span is
    also tried once per non-empty entry of its menu, as the program does
    (NOTE [ Kept nodes in the frontier DP ] in ``solvers.frontier.kept``).

    Returns:
        ``{exit key: (dA, cost, lf, lb, plans)}`` (exit keys as node positions), ``plans`` their
        ``(regions, kept nodes)``, relative to ``s``.

    Raises:
        BlockFrontTooLarge: a boundary holds more than :data:`MAX_PLANS` plans.
    """
    size = e - s + 1
    start = (np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, NEG, np.int64), np.full(1, NEG, np.int64),
             [((), ())])
    states: list[dict[tuple[int, ...], list[tuple]]] = [{} for _ in range(size + 1)]
    states[0][key] = [start]
    ends = prog.span_ends

    def push(r: int, nkey: tuple[int, ...], entry: tuple) -> None:
        states[r].setdefault(nkey, []).append(entry)

    for p in range(s, e + 1):
        prog.stop_if_over(p)
        r = p - s
        allowed = ends[p][ends[p] <= e] if ends is not None and prog.recomputable[p] else np.zeros(0, np.int64)
        terms = prog.region_terms(p, int(allowed[-1])) if len(allowed) else None
        m = int(allowed[-1]) - p + 1 if len(allowed) else 0
        first_reader = prog.reader_bounds(p, m)[0] if m else {}
        maxima: dict[frozenset, tuple] = {}
        kept = {b: prog.kept.entries(p, b, terms) for b in allowed.tolist()} if prog.kept is not None else {}
        fas = HeldBytes(prog, p, m) if kept else None
        for k, chunks in states[r].items():
            dA, cost, lf, lb, regs = _prune(chunks)
            if len(dA) > MAX_PLANS:
                raise BlockFrontTooLarge(len(dA), p)
            prog.count(steps=1 + len(allowed), entries=(1 + len(allowed)) * len(dA))
            sdA, slf, slb, nkey = prog.stored_step(p, k)
            push(r + 1, nkey, (dA + sdA, cost, np.maximum(lf, dA + slf), np.maximum(lb, dA + slb), regs))
            held = frozenset(k)
            for b in allowed.tolist():
                eff = held | frozenset(j for j, f in first_reader.items() if f <= b)
                if eff not in maxima:
                    maxima[eff] = prog.region_maxima(terms, eff, p, m)[:2]
                rlf, rlb = maxima[eff]
                i = b - p
                push(b - s + 1, prog.region_nkey(eff, p, b),
                     (dA + int(terms[3][i]), cost + int(terms[6][i]), np.maximum(lf, dA + int(rlf[i])),
                      np.maximum(lb, dA + int(rlb[i])), [(x + ((r, b - s),), y) for x, y in regs]))
                for ent in kept.get(b, ()):  # NOTE [ Kept nodes in the frontier DP ]
                    rel = tuple(k - s for k in ent.kept)
                    push(b - s + 1, ent.exit_key(prog, p, b, eff),
                         (dA + ent.dA, cost + ent.cost, np.maximum(lf, dA + ent.f),
                          np.maximum(lb, dA + ent.back(fas.of(eff)[:i + 1])),
                          [(x + ((r, b - s),), y + rel) for x, y in regs]))
        states[r] = {}
    out = {}
    for k, chunks in states[size].items():
        dA, cost, lf, lb, regs = _prune(chunks)
        out[k] = (dA, cost, lf, lb, tuple(regs))
    return out
