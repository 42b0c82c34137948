"""Repeated blocks: found by structure, each crossed by its own Pareto front.

NOTE [ Composing repeated blocks ]
    Real LLMs are a chain of identical blocks plus a few tensors every block
    reads (rotary tables, the causal mask, position ids). The frontier
    program (NOTE [ The frontier DP ] in ``solvers.frontier.program``) walks every
    node of every block; here a block is solved once and crossed in one step.

    *Finding the chain, by structure.* Each node gets a hash of what it is
    (bytes, FLOPs, what it saves, flags, how many inputs and readers; no
    names). The period ``P`` whose longest run of ``h[k] == h[k + P]``
    covers the most nodes gives the block length; on a graph with spans the
    phase is the one that cuts no span (below). Candidate blocks are then
    compared exactly: a block's *signature* is everything the program reads
    while inside it, relative to its first node: per node its bytes, FLOPs,
    buffers, flags, readers and savers inside the block, last consumer and
    first saver (clipped at the block's end), the allowed region ends, the
    forward bytes of tensors awaiting a consumer, and its gradient bytes and
    later sinks relative to the block's end; and the tensors open at its
    entry (the residual stream, the common tensors, in a canonical order) and
    at its exit. Blocks with equal signatures are solved once.

    *Exactness.* In the program a step from boundary ``p`` checks
    ``A + local <= cap``, where ``A`` is the bytes retained before ``p`` and
    ``local`` depends on the held open tensors (the key) and the step only.
    Inside a block ``A`` is the entry's ``A`` plus what the block retained so
    far, so a plan of the block, entered with key ``K``, is summed up by
    ``(dA, cost, lf, lb)``: what it retains, what it recomputes, and its
    largest forward (``lf``) and backward or recompute (``lb``) live bytes
    less the entry's ``A``. The forward terms are the same for every copy of
    the block; the backward ones are shifted by a constant per copy (the
    gradients of the parameters of the blocks after it, and the outputs
    nobody reads produced after it), ``off``. So a copy entered with
    ``(A, cost)`` under ``cap`` can take the plan exactly when
    ``A + max(lf, lb + off) <= cap``, and leaves with ``(A + dA, cost +
    cost_plan)`` and the plan's exit key. Keeping, per entry key and exit
    key, the plans no other beats in all four numbers (the block's Pareto
    front, ``solvers.blocks.front``) loses no optimum; the front does not
    depend on the budget, so it is built once per graph and entry key and
    serves every budget and the least-peak search. Tensors every block reads
    stay what they are in the program: open tensors whose held bit is part
    of the key and whose bytes are counted at every step, so nothing is
    charged for the whole step as ColossalAI's linearisation does.

    *Where regions may go.* A block is crossed only from its first node, so
    no region may start strictly inside a crossed block and end after it,
    or start before it and end strictly inside it. On a graph with spans
    a span that does is a module call across blocks; the blocks it cuts are
    walked node by node instead (a span around whole blocks, like the model
    call, is an ordinary region of the program). Without spans any interval
    is allowed, regions cut every block, and the program walks every node:
    the composition is exact over the plans it sees, and over a graph
    without spans it would not see them all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .front import BlockPlans, block_front
from ..frontier.front import BlockStep

__all__ = ["Block", "Chain", "find_chain", "period", "MIN_BLOCKS"]

log = logging.getLogger(__name__)

#: Fewest copies of a block worth composing.
MIN_BLOCKS = 2


@dataclass
class Block:
    """One copy of a repeated block in the chain.

    Attributes:
        first, last: its nodes (inclusive).
        group: index of its signature among the chain's (equal groups: one front).
        off: what its backward live bytes exceed its group's reference copy's by.
        entry: the tensors open at its entry, in the canonical order.
        exit: per tensor open at its exit, its descriptor: ``("in", i)`` (the
            ``i``-th entry tensor) or ``("own", r)`` (its node ``first + r``).
    """

    first: int
    last: int
    group: int
    off: int
    entry: tuple[int, ...]
    exit: dict[int, tuple[str, int]]
    _index: dict[int, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {j: c for c, j in enumerate(self.entry)}

    def canon(self, key: tuple[int, ...]) -> frozenset[int]:
        """The held entry tensors ``key`` (node positions) as canonical indices."""
        return frozenset(self._index[j] for j in key)

    def resolve(self, desc: tuple[tuple[str, int], ...]) -> tuple[int, ...]:
        """An exit key given by descriptors, as node positions of this copy."""
        return tuple(sorted(self.entry[i] if kind == "in" else self.first + i for kind, i in desc))


class Chain:
    """The blocks the frontier program crosses by their fronts, and those fronts.

    Attributes:
        blocks: the crossed copies, in order.
        seams: first node -> last node of each crossed copy.
        inside: per boundary ``0..n``, whether it lies strictly inside a crossed copy.
        refs: per group, its reference copy (the fronts are built on it).
    """

    def __init__(self, program: Any, blocks: list[Block], refs: list[Block]) -> None:
        self.blocks = blocks
        self.refs = refs
        self.seams = {b.first: b.last for b in blocks}
        self._by_first = {b.first: b for b in blocks}
        self.inside = np.zeros(program.n + 1, dtype=bool)
        for b in blocks:
            self.inside[b.first + 1:b.last + 1] = True
        self._fronts: dict[tuple[int, frozenset], list[BlockPlans]] = {}
        self._work: dict[tuple[int, frozenset], int] = {}  # the work each front took to build

    def block_at(self, p: int) -> Block | None:
        """The crossed copy holding boundary ``p`` strictly inside, if any."""
        return next((b for b in self.blocks if b.first < p <= b.last), None)

    def plans(self, program: Any, group: int, canon: frozenset[int]) -> list[BlockPlans]:
        """The group's Pareto front entered with the canonical key ``canon`` (built once)."""
        got = self._fronts.get((group, canon))
        if got is not None:
            program.work += self._work[group, canon]  # as if built now: the work does not depend on earlier calls
        else:
            ref = self.refs[group]
            key = tuple(sorted(ref.entry[c] for c in canon))
            before = program.work
            raw = block_front(program, ref.first, ref.last, key)
            self._work[group, canon] = program.work - before
            got = [BlockPlans(tuple(sorted(ref.exit[j] for j in exit_key)), *arrays[:4],
                              tuple(x for x, _ in arrays[4]), tuple(y for _, y in arrays[4]))
                   for exit_key, arrays in raw.items()]
            self._fronts[group, canon] = got
            log.debug("block front of group %d (nodes %d-%d), entry %s: %d plans", group, ref.first, ref.last,
                      sorted(canon), sum(len(x.cost) for x in got))
        return got

    def cross(self, program: Any, p: int, fr: Any, target: Any, cap: int) -> int:
        """Carry the front ``fr`` at the first node ``p`` of a crossed copy over
        the whole copy into ``target`` (the front after its last node); returns that last node."""
        blk = self._by_first[p]
        for key, (a, o, *_rest) in fr.keys.items():
            for plans in self.plans(program, blk.group, blk.canon(key)):
                local = np.maximum(plans.lf, plans.lb + blk.off)
                cuts = np.searchsorted(a, cap - local, side="right")
                program.count(steps=1, elements=len(local), entries=int(cuts.sum()))
                nkey = blk.resolve(plans.exit)
                for t in np.nonzero(cuts)[0].tolist():
                    regions, saved = plans.regions[t], plans.saved[t]
                    step = BlockStep(tuple((blk.first + x, blk.first + y) for x, y in regions),
                                     tuple(blk.first + k for k in saved))
                    target.add(nkey, a, o, int(cuts[t]), int(plans.dA[t]), int(plans.cost[t]), int(local[t]),
                               (p, key, step))
        return blk.last


# ---------------------------------------------------------------- finding
def _node_hashes(graph: Any) -> np.ndarray:
    """A hash per node of what it is, without names or positions."""
    succs = graph.succs
    out = np.empty(len(graph), dtype=np.int64)
    for k, nd in enumerate(graph.nodes):
        saved = tuple(i for i, x in enumerate(nd.inputs) if x in nd.saves_inputs)
        out[k] = hash((nd.out_bytes, nd.fwd_flops, nd.fwd_cost, nd.bwd_flops, nd.saved_bytes, nd.workspace_bytes,
                       nd.param_bytes, nd.state_bytes, nd.saves_output, nd.requires_grad, nd.recomputable,
                       nd.grad_views, nd.stochastic, nd.stateful, len(nd.inputs), saved, len(succs[k])))
    return out


def period(h: np.ndarray, min_blocks: int = MIN_BLOCKS) -> tuple[int, int, int] | None:
    """``(P, start, length)``: the period whose longest run of ``h[k] == h[k + P]``
    covers the most whole blocks (the shortest such ``P``), the run's first
    node and how many nodes it covers; None when no run holds ``min_blocks`` blocks."""
    n = len(h)
    best = None
    for P in range(1, n // min_blocks + 1):
        eq = np.concatenate(([False], h[:-P] == h[P:], [False])).astype(np.int8)
        d = np.diff(eq)
        starts, ends = np.nonzero(d == 1)[0], np.nonzero(d == -1)[0]
        if not len(starts):
            continue
        i = int(np.argmax(ends - starts))
        covered = ((int(ends[i] - starts[i]) + P) // P) * P
        if covered // P >= min_blocks and (best is None or covered > best[2]):
            best = (P, int(starts[i]), covered)
    return best


def _cut_spans(spans: np.ndarray, first: int, last: int) -> bool:
    """Whether a span starts strictly inside ``[first, last]`` and ends after it,
    or starts before it and ends strictly inside it."""
    a, b = spans[:, 0], spans[:, 1]
    return bool(np.any(((a > first) & (a <= last) & (b > last)) | ((a < first) & (b >= first) & (b < last))))


def _signature(prog: Any, s: int, e: int) -> tuple[tuple, tuple[int, ...], dict[int, tuple[str, int]], int]:
    """``(signature, entry, exit, base)`` of the block ``[s, e]`` (NOTE [ Composing repeated blocks ])."""
    na, graph = prog.na, prog.graph
    top = e + 1

    def rel(x: int) -> int:
        return -1 if x < 0 else min(int(x), top) - s

    base_g, base_s = int(na.gr[e]), int(prog.sinks_after[e + 1])
    ends = prog.span_ends
    nodes = []
    for k in range(s, e + 1):
        nodes.append((
            int(na.out[k]), int(na.own[k]), int(na.cur[k]), int(na.flops[k]), int(na.state[k]), bool(prog.rg[k]),
            bool(prog.sink[k]),
            bool(prog.selfsave[k]), bool(prog.recomputable[k]),
            int(na.gb[k]) - base_g if prog.rg[k] else None, int(na.gr[k]) - base_g,
            int(prog.open_fwd[k]), int(prog.sinks_after[k + 1]) - base_s,
            rel(int(prog.lc[k])), rel(int(na.fs[k])), rel(int(prog.last[k])),
            tuple(c - s for c in prog.readers[k] if c <= e), tuple(sorted(c - s for c in prog.savers[k] if c <= e)),
            tuple(int(b) - s for b in ends[k] if b <= e) if ends is not None else None,
            tuple(sorted((b - s, x) for b, x in prog.span_extra_from[k] if b <= e)),
            # with kept nodes, what keeping k does (NOTE [ Kept nodes in the frontier DP ]); its rank in a
            # region's menu follows from its cost and bytes, its position only breaks ties
            (bool(graph.nodes[k].sac_op >= 0), int(na.buf[k]), int(na.ws[k])) if prog.kept is not None else None,
        ))

    def desc(j: int) -> tuple:
        return (int(na.out[j]), tuple(c - s for c in prog.readers[j] if s <= c <= e),
                tuple(sorted(c - s for c in prog.savers[j] if s <= c <= e)), rel(int(prog.lc[j])))

    entry_desc = sorted((desc(j), j) for j in prog.opens[s])
    entry = tuple(j for _, j in entry_desc)
    index = {j: c for c, j in enumerate(entry)}
    exit_ = {j: ("in", index[j]) if j < s else ("own", j - s) for j in prog.opens[e + 1]}
    sig = (e - s + 1, tuple(nodes), tuple(d for d, _ in entry_desc), tuple(sorted(exit_.values())))
    return sig, entry, exit_, base_g + base_s


def find_chain(prog: Any) -> Chain | None:
    """The chain of repeated blocks the program ``prog`` can cross by their
    fronts, or None (no spans, no block repeated :data:`MIN_BLOCKS` times, or
    no copy that no span cuts)."""
    graph = prog.graph
    if not graph.spans or prog.span_ends is None:
        return None  # any interval is a region: regions may cut every block (NOTE [ Composing repeated blocks ])
    found = period(_node_hashes(graph))
    if found is None:
        return None
    P, start, covered = found
    spans = np.array([(a, b) for a in range(prog.n) for b in prog.span_ends[a].tolist()], dtype=np.int64)
    spans = spans.reshape(-1, 2)
    best = None
    for phase in range(P):  # the phase that cuts the fewest copies (then: fewest open tensors at the seams)
        firsts = list(range(start + phase, start + covered - P + 1, P))
        ok = [s for s in firsts if not _cut_spans(spans, s, s + P - 1)]
        score = (len(ok), -sum(len(prog.opens[s]) for s in ok))
        if best is None or score > best[0]:
            best = (score, ok)
    firsts = best[1] if best is not None else []
    if len(firsts) < MIN_BLOCKS:
        return None
    groups: dict[tuple, list[tuple[int, tuple[int, ...], dict, int]]] = {}
    for s in firsts:
        sig, entry, exit_, base = _signature(prog, s, s + P - 1)
        groups.setdefault(sig, []).append((s, entry, exit_, base))
    blocks: list[Block] = []
    refs: list[Block] = []
    for members in groups.values():
        if len(members) < MIN_BLOCKS:
            continue
        group = len(refs)
        ref_base = members[0][3]
        copies = [Block(s, s + P - 1, group, base - ref_base, entry, exit_) for s, entry, exit_, base in members]
        refs.append(copies[0])
        blocks += copies
    if not blocks:
        return None
    blocks.sort(key=lambda b: b.first)
    chain = Chain(prog, blocks, refs)
    log.info("frontier %s: %d blocks of %d nodes in %d group(s), crossed by their fronts", graph.name, len(blocks), P,
             len(refs))
    return chain
