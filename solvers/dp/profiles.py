"""Segment profiles of a stage chain: the memory model the DP composes.

NOTE [ Decomposing the simulated peak over a chain ]
    Split the topological order at articulation cuts into stages
    (``solvers.model.stages``). A plan restricted to stage boundaries is a sequence
    of *segments*: a stored stage, or a region spanning one or more stages.
    Every step of ``simulate`` belongs to one segment (its forward steps, a
    region's recompute steps, its backward steps), and the bytes live at such
    a step are

        const + (bytes retained by earlier segments) + (the segment's own bytes)

    because (1) what an earlier segment keeps (a stored node's saved tensors
    and buffers, a region's inputs, outputs held by the caller) is released
    only when the backward reaches that earlier segment, after every step of
    this one; (2) no other tensor of the earlier segments crosses the cut but
    the boundary tensor ``t`` (``out(a - 1)`` on a chain; on a DAG the one
    tensor that crosses, produced in the stage before); (3) gradients and parameter
    gradients do not depend on the plan at all (``GB``/``GR`` below); and
    (4) common tensors are charged to ``const`` for the whole step.

    The boundary tensor belongs to the left segment when its producer keeps it
    (stored, ``saves_output``) or the caller does (a sink): then it is part of
    the retained bytes (``lh = 1``). Otherwise the right segment accounts for
    it (``lh = 0``): awaited by its consumers, held by a stored consumer that
    saves it, or held as a region's input.

    So a plan's peak is ``const + max over segments s of (R_before(s) + L(s))``
    where ``L`` is the segment's local peak and ``R`` what it retains. The
    functions here compute ``L`` and ``R`` for every stored stage and every
    region ``(first stage, last stage)``, with prefix sums and numpy, in
    ``O(stages x nodes)`` time and, one first stage at a time, ``O(nodes)``
    memory (NOTE [ Linear memory in dp ]). On a chain (and on any DAG without common tensors)
    this is exactly ``simulate``; common tensors make it an upper bound.

    Outputs nobody consumes (the loss, returned logits) are held by the caller
    from their forward step to the end whatever the plan: they are charged
    globally (``p_sink``), never retained by a segment. So are the outputs a
    ``"held"`` loop keeps (NOTE [ The user's loop ] in ``graphs.graph``),
    though later nodes read them: their forward copies are left out of every
    per-segment term (open, saved, boundary), and only their recomputed
    copies are the region's (freed as the simulator frees them: when the
    recompute ends, or at their first saver's backward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from graphs import Graph

from ..model.gradients import GradientWalk
from ..model.stages import Stages
from ..model.terms import INF, terms_of

__all__ = ["NodeArrays", "node_arrays", "stored_profile", "step_rows", "RegionRows", "region_profiles", "region_rng",
           "NEG"]

#: Stands for "no step" in max-reductions.
NEG = -(1 << 62)


@dataclass(frozen=True)
class NodeArrays:
    """Per-node quantities of the execution model (numpy int64 arrays).

    Attributes:
        out: output bytes (0 for common tensors, charged to ``const``).
        own: bytes of the node's own saved buffers kept for its backward.
        cur: bytes allocated while the node's forward runs (output, buffers,
            workspace).
        lc: position of the last consumer, -1 for none.
        sink: the caller holds the output to the end (no consumer reads it,
            or the loop holds it: ``Terms.sinks``).
        fs: first node that saves the output for its backward (itself or a
            consumer, with requires_grad), ``INF`` for none.
        cs: first *consumer* that saves it, ``INF`` for none.
        rg: requires_grad.
        gb: gradient + parameter-gradient + transient bytes at the node's
            backward step (plan independent).
        gr: gradient + parameter-gradient bytes just before its backward
            (what a region recomputed there finds alive).
        flops: forward FLOPs (the recompute cost of the node).
        state: bytes of buffers a region holding the node snapshots while it recomputes.
        buf: bytes of the node's own buffers (``saved_bytes``, with or without grad).
        ws: workspace bytes of its forward.
        const: bytes alive at every step: parameters, inputs, common tensors.
        p_sink, p_hu, p_as, p_a: prefix sums (length n + 1) used by the profiles.
        open_all, u_all, v_all, v_as: open-tensor sums per step (see code).
    """

    out: np.ndarray
    own: np.ndarray
    cur: np.ndarray
    lc: np.ndarray
    sink: np.ndarray
    fs: np.ndarray
    cs: np.ndarray
    rg: np.ndarray
    gb: np.ndarray
    gr: np.ndarray
    flops: np.ndarray
    state: np.ndarray
    const: int
    p_sink: np.ndarray
    p_as: np.ndarray
    p_a: np.ndarray
    open_all: np.ndarray
    u_all: np.ndarray
    v_all: np.ndarray
    v_as: np.ndarray
    p_hu: np.ndarray
    buf: np.ndarray
    ws: np.ndarray
    p_sto: np.ndarray | None = None  # prefix count of stochastic nodes (length n + 1)
    rng: int = 0  # Graph.rng_state_bytes: what a stochastic region stores (NOTE [ RNG state per region ])


def _prefix(x: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(x, dtype=np.int64)))


def node_arrays(graph: Graph, common: frozenset[int]) -> NodeArrays:
    """Compute :class:`NodeArrays` for ``graph`` (one pass, plan independent)."""
    nodes = graph.nodes
    n = len(nodes)
    rg = np.array([nd.requires_grad for nd in nodes], dtype=bool)
    real_out = [nd.out_bytes for nd in nodes]
    out = np.array([0 if i in common else nd.out_bytes for i, nd in enumerate(nodes)], dtype=np.int64)
    own = np.array([nd.saved_bytes if nd.requires_grad else 0 for nd in nodes], dtype=np.int64)
    cur = out + np.array([nd.saved_bytes + nd.workspace_bytes for nd in nodes], dtype=np.int64)
    terms = terms_of(graph)
    lc = np.array(terms.last_reader, dtype=np.int64)
    sink = np.array(terms.sinks, dtype=bool)
    fs = np.array(terms.first_saver, dtype=np.int64)
    cs = np.array(terms.first_consumer_saver, dtype=np.int64)
    # Gradients: the same walk as simulate's backward, without activations.
    gb = np.full(n, NEG, dtype=np.int64)
    gr = np.zeros(n, dtype=np.int64)
    pgrad = graph.unattributed_grad_bytes()
    grads = GradientWalk(graph)
    grads.start()
    for i in range(n - 1, -1, -1):
        gr[i] = grads.bytes + pgrad
        if not rg[i]:
            continue
        transient = grads.node_backward(i)
        pgrad += nodes[i].param_bytes
        gb[i] = grads.bytes + pgrad + transient
        grads.node_done(i)
    sa = fs < INF
    # open_all[k]: sum of out[j], j < k <= lc[j], j not held by the caller (whose forward
    # copies p_sink counts); u_all: the same for unsaved j; v_all[k]: sum of out[j],
    # j <= k < fs[j] < INF (recomputed copies: held ones too); v_as: without the held ones.
    d_open = np.zeros(n + 2, dtype=np.int64)
    d_u = np.zeros(n + 2, dtype=np.int64)
    d_v = np.zeros(n + 2, dtype=np.int64)
    d_vs = np.zeros(n + 2, dtype=np.int64)
    j = np.arange(n)
    m = (lc > j) & ~sink
    np.add.at(d_open, j[m] + 1, out[m])
    np.add.at(d_open, lc[m] + 1, -out[m])
    mu = m & ~sa
    np.add.at(d_u, j[mu] + 1, out[mu])
    np.add.at(d_u, lc[mu] + 1, -out[mu])
    mv = sa & (fs > j)
    np.add.at(d_v, j[mv], out[mv])
    np.add.at(d_v, fs[mv], -out[mv])
    mv = mv & ~sink
    np.add.at(d_vs, j[mv], out[mv])
    np.add.at(d_vs, fs[mv], -out[mv])
    return NodeArrays(
        out=out, own=own, cur=cur, lc=lc, sink=sink, fs=fs, cs=cs, rg=rg, gb=gb, gr=gr,
        flops=np.array(graph.recompute_costs(), dtype=np.int64),
        state=np.array([nd.state_bytes for nd in nodes], dtype=np.int64),
        const=graph.param_bytes + graph.input_bytes + sum(real_out[i] for i in common),
        p_sink=_prefix(out * sink), p_as=_prefix(out * (sa & ~sink) + own), p_a=_prefix(out * sa + own),
        p_hu=_prefix(out * (sink & ~sa)),
        open_all=np.cumsum(d_open)[:n], u_all=np.cumsum(d_u)[:n], v_all=np.cumsum(d_v)[:n],
        v_as=np.cumsum(d_vs)[:n],
        buf=np.array([nd.saved_bytes for nd in nodes], dtype=np.int64),
        ws=np.array([nd.workspace_bytes for nd in nodes], dtype=np.int64),
        p_sto=_prefix(np.array([bool(nd.stochastic) for nd in nodes], dtype=np.int64)),
        rng=int(graph.rng_state_bytes),
    )


def region_rng(na: NodeArrays, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray | int:
    """Generator-state bytes a region ``[a, b]`` (node positions, broadcast) stores: ``na.rng`` when
    a node in it is stochastic (NOTE [ RNG state per region ] in ``solvers.model.terms``)."""
    if not na.rng or na.p_sto is None:
        return np.zeros(np.broadcast(a, b).shape, dtype=np.int64) if np.ndim(a) or np.ndim(b) else 0
    return na.rng * ((na.p_sto[np.asarray(b) + 1] - na.p_sto[np.asarray(a)]) > 0).astype(np.int64)


def stored_profile(na: NodeArrays, a: int, b: int, lh: int, p: int | None = None,
                   q: int | None = None) -> tuple[int, int, int]:
    """``(L, R, lh_next)`` of stage ``[a, b]`` run without checkpointing.

    ``lh`` says whether the boundary tensor ``out(p)`` is already counted
    by the left segment (NOTE [ Decomposing the simulated peak over a chain ]);
    ``p`` defaults to ``a - 1``, and ``q``, the next stage's boundary tensor,
    to ``b``.
    """
    k = np.arange(a, b + 1)
    has_p = a > 0 and not lh
    p = a - 1 if p is None else p
    q = b if q is None else q
    fwd = (na.p_as[k] - na.p_as[a]) + na.p_sink[k] + na.u_all[k] + na.cur[k]
    bwd = (na.p_as[k + 1] - na.p_as[a]) - na.v_as[k] + na.p_sink[-1] + na.gb[k]
    retained = int(na.p_as[b + 1] - na.p_as[a] - na.v_as[b])
    if a > 0:
        op = 0 if na.sink[p] else int(na.out[p])  # a held boundary tensor is charged globally
        sa_p = bool(na.fs[p] < INF)
        fwd = fwd - op * ((na.lc[p] >= k) & (not sa_p))
        bwd = bwd + op * ((k < na.fs[p]) & sa_p)
        retained += op * int(b < na.fs[p] < INF)
        if has_p:
            fwd = fwd + op * ((na.lc[p] >= k) | bool(na.cs[p] < INF))
            bwd = bwd + op * (na.cs[p] <= k)
            retained += op * int(na.cs[p] < INF)
    bwd = np.where(na.rg[k], bwd, NEG)
    local = max(int(fwd.max()), int(bwd.max()))
    lh_next = int(bool(na.sink[q]) or bool(na.fs[q] <= b) or bool(na.out[q] == 0))
    return local, retained, lh_next


def step_rows(na: NodeArrays, starts: np.ndarray, bnd: np.ndarray, lo: int = 0,
              hi: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes at every step of regions starting at ``starts`` (one row each).

    Args:
        na: the node arrays.
        starts: first node of each region.
        bnd: per row the boundary tensor entering it (``-1``: none).
        lo, hi: the steps (columns) wanted, ``lo <= k < hi`` (default: all).

    Returns:
        ``(f, rc, bw)``, ``len(starts) x (hi - lo)``: at column ``k - lo`` the
        bytes of the region's forward step, recompute step and backward step
        at node ``k``, without its input, the sinks, the gradients before its
        recompute and its snapshot (:func:`region_row` adds them); ``NEG``
        before the region and at backward steps of nodes without grad.
    """
    n = len(na.out)
    k = np.arange(lo, n if hi is None else hi)[None, :]
    a = starts[:, None]
    p = np.maximum(bnd, 0)[:, None]
    has_p = a > 0
    op = np.where(has_p, na.out[p], 0)
    oh = np.where(na.sink[p], 0, op)  # a held boundary tensor is in no open sum (charged globally)
    f = na.p_sink[k] + na.open_all[k] - oh * (na.lc[p] >= k) + na.cur[k]
    sa_p = na.fs[p] < INF
    # Recomputed sinks stay referenced by the running region (its outputs) until it ends (the saved
    # ones are in p_a already).
    rc = ((na.p_a[k] - na.p_a[a]) + (na.p_hu[k] - na.p_hu[a]) + na.u_all[k] - oh * (~sa_p & (na.lc[p] >= k))
          + na.cur[k])
    bw = (na.p_a[k + 1] - na.p_a[a]) - (na.v_all[k] - op * ((k < na.fs[p]) & sa_p)) + na.gb[k]
    before = k < a
    f = np.where(before, NEG, f)
    rc = np.where(before, NEG, rc)
    bw = np.where(before | ~na.rg[k], NEG, bw)
    return f, rc, bw


class RegionRows:
    """Local peaks of the regions spanning stages ``i..j``, one first stage ``i`` at a time.

    NOTE [ Linear memory in dp ]
        A row holds the regions of one first stage: ``O(n)`` bytes, where the
        whole table of every ``(i, j)`` once took ``stages x nodes`` int64s
        at a time (2.98 GiB for a 20,000-node chain, MemoryError at 100,000).
        ``dp`` asks for the rows right to left and drops each when the stage is merged.

    Args:
        na: the node arrays.
        st: the stage chain.
        span_extra: ``Graph.span_extra_bytes()``: adds a span's
            ``extra_bytes`` to every recompute step of the region equal to it
            (eager lifetimes in a recompute, NOTE [ Execution model ] in
            ``solvers.model.simulate``).
    """

    def __init__(self, na: NodeArrays, st: Stages, span_extra: Mapping[tuple[int, int], int] | None = None) -> None:
        self.na = na
        self.starts = np.array(st.starts, dtype=np.int64)
        self.ends = np.array(st.ends, dtype=np.int64)
        self.bnd = np.array(st.boundary if st.boundary else [s - 1 for s in st.starts], dtype=np.int64)
        self.pst = _prefix(na.state)
        self.pf = _prefix(na.flops)
        self.sinks = int(na.p_sink[-1])
        self.extra: dict[int, list[tuple[int, int]]] = {}  # first stage -> (last stage, extra bytes)
        if span_extra:
            first, last = {a: i for i, a in enumerate(st.starts)}, {b: j for j, b in enumerate(st.ends)}
            for (a, b), extra in span_extra.items():
                if a in first and b in last:
                    self.extra.setdefault(first[a], []).append((last[b], extra))

    def inp(self, i: int) -> int:
        """Bytes of the boundary tensor a region starting at stage ``i`` holds (when ``lh == 0``)."""
        a, pb = int(self.starts[i]), max(int(self.bnd[i]), 0)
        return int(self.na.out[pb]) * int(a > 0 and self.na.lc[pb] >= a)

    def row(self, i: int, jmax: int) -> tuple[np.ndarray, np.ndarray]:
        """``(L0, cost)`` of the regions ``i..j`` for ``j`` in ``i..jmax`` (index ``j - i``): the local
        peak without the input (add :meth:`inp` when ``lh == 0``) and the recompute cost. A stochastic
        region's stored generator state (:func:`region_rng`) is in ``L0``; what it retains for later
        segments is the caller's to add."""
        na = self.na
        a = int(self.starts[i])
        ends = self.ends[i:jmax + 1]
        f, rc, bw = step_rows(na, self.starts[i:i + 1], self.bnd[i:i + 1], a, int(ends[-1]) + 1)
        at = ends - a
        fm = np.maximum.accumulate(f[0])[at]
        rm = np.maximum.accumulate(rc[0])[at]
        bm = np.maximum.accumulate(bw[0])[at]
        snapshot = self.pst[ends + 1] - self.pst[a]  # state buffers copied for the recompute
        for j, extra in self.extra.get(i, ()):  # eager lifetimes: constant over the region's recompute steps
            if j <= jmax:
                snapshot[j - i] += extra
        # NOTE [ RNG state per region ]: a stochastic region holds the generator state at all its steps
        # (it is also retained), and once more while it recomputes.
        rng = region_rng(na, a, ends)
        fm = np.where(fm > NEG, fm + rng, NEG)
        rm = np.where(rm > NEG, rm + self.sinks + na.gr[ends] + snapshot + 2 * rng, NEG)
        bm = np.where(bm > NEG, bm + self.sinks + rng, NEG)
        return np.maximum(fm, np.maximum(rm, bm)), self.pf[ends + 1] - self.pf[a]


def region_profiles(na: NodeArrays, st: Stages, span_extra: Mapping[tuple[int, int], int] | None = None,
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every row of :class:`RegionRows` at once, ``stages x stages`` (small graphs and tests only:
    NOTE [ Linear memory in dp ]).

    Returns:
        ``(L0, cost, inp)``: ``L0[i, j]`` and ``cost[i, j]`` as :meth:`RegionRows.row` gives them,
        ``inp[i]`` as :meth:`RegionRows.inp`. Entries with ``j < i`` are 0.
    """
    rows = RegionRows(na, st, span_extra)
    m = len(st)
    l0, cost = np.zeros((m, m), dtype=np.int64), np.zeros((m, m), dtype=np.int64)
    for i in range(m):
        l0[i, i:], cost[i, i:] = rows.row(i, m - 1)
    return l0, cost, np.array([rows.inp(i) for i in range(m)], dtype=np.int64)
