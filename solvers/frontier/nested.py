"""Nested regions in the frontier program: a region whose child calls are checkpointed inside it.

NOTE [ Nested regions in the frontier DP ]
    With ``nested`` the frontier program (NOTE [ The frontier DP ] in
    ``solvers.frontier.program``) extends a front also by every region
    ``[p, b]`` that has child calls (:func:`~solvers.model.nested.inner_menu`) in
    its nested variant (NOTE [ Nested regions ] in ``solvers.model.nested``), once
    more beside the plain one, so its optimum is over ``(one-level plan,
    nested flags)`` pairs: the set ``brute_force(..., nested=True)`` and
    ``dp`` (``nested=True``) search (with ``selective``, regions that keep
    nodes are never nested, as ``Plan`` asks). The nested variant's rows:

    * forward: the plain region's steps plus, from the first node ``x`` of
      each stochastic inner region on, its generator state (the walk's
      ``rng_fwd``); what joins the retained bytes ``A`` after it: the plain
      region's plus those generator states (released at ``x``'s backward,
      inside the region's own steps); its exit key is the plain region's
      (the forward holds the same tensors);
    * recompute and backward: the steps of ``NestedWalk`` at the region's
      nodes, in its order: the outer recompute (up to the early stop), then
      per inner region (last first) its one-level recompute and the backward
      of its nodes, with the backward of the outer's own nodes between. Each
      such step at node ``k`` has live bytes ``A + fa(k) + row``, where
      ``A`` are the retained bytes before the region, ``fa(k)`` the held open
      tensors not yet closed at ``k`` (the same term as the plain region's
      rows: held open tensors are alive through the whole backward of the
      region, split between ``fa`` and the region's ``cA``) and ``row`` is
      bit-independent. The rows are read off ``simulate`` (the one cost
      model), once per graph: every usable span with child calls, in as few
      plans of disjoint regions as a greedy pass finds, all plain in one plan
      and all nested in the other (as ``dp`` does, NOTE [ Nested regions in
      the chain decomposition ] in ``solvers.dp.nested``; the generator
      states the nested regions before a region retain are taken off its
      steps). ``row = live_nested(step) - base(k)``, where ``base(k) =
      live_plain(recompute of k) - rc[k] - gr[b] - held[b]`` (the plain
      recompute step's context, the program's own decomposition) removes
      ``A`` and ``fa(k)`` of that plan; the rows at one ``k`` are reduced to
      their maximum, and the region's local backward peak is
      ``max_k (row(k) + fa(k))`` for each held pattern;
    * cost: the plain region's plus the difference of the two plans'
      recompute costs (the second recompute of inner regions, less what the
      early stop skips).

    The rows are exact where the nested walk's steps at the region's nodes
    depend on the rest of the plan only through ``A`` and the held open
    tensors, the decomposition the program makes of every other step. That
    is checked, not derived: ``tests/solvers/test_frontier_nested.py``
    compares the optimum (and the least peak) with the brute force on 49
    random DAGs with spans, stochastic nodes and extra bytes (5 of them with
    kept sets too); on the 889 random DAGs with child calls of seeds
    0..999 (3,608 budgets, most stochastic) and on 768 budgets with kept
    sets (graphs of seeds 0..399 the brute force takes) it found no
    difference at the time of writing. ``by_frontier`` simulates every
    answer (a disagreement is a ``SolverBug``, never a plan). The forward
    term (the inner generator states) bound no optimum among those cases;
    the retained ones did (``RNG_SEEDS`` in the test).

    A chain of repeated blocks is not composed with ``nested``
    (``solvers.blocks``: the program walks every node); the plans are the
    same, only slower to find on long chains.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dp.profiles import NEG
from ..model.plan import Plan
from ..model.simulate import simulate
from ..model.terms import region_rng_bytes
from ..model.nested import inner_menu
from .front import NestedStep

__all__ = ["NestedStep", "NestedRegions", "NestedRows", "SIMULATE_NODE_WORK"]

#: What ``simulate`` (with its timeline) weighs per node in work units (NOTE [ The frontier program's work ]):
#: about 4.4 us a node on an idle core (a 1,193-node transformer with spans).
SIMULATE_NODE_WORK = 70


@dataclass(frozen=True)
class NestedRows:
    """One nested region ``[p, b]``'s bit-independent terms (NOTE [ Nested regions in the frontier DP ]).

    Attributes:
        f: the largest live bytes of its forward steps, less the retained bytes before the region.
        rows: per node ``k`` of the region, the largest ``row`` of its recompute and backward steps at ``k``
            (``NEG``: none), to which the held open tensors' bytes at ``k`` are added.
        dA: what joins the retained bytes after it.
        cost: its recompute cost.
    """

    f: int
    rows: np.ndarray
    dA: int
    cost: int

    def back(self, fa: np.ndarray) -> int:
        """The largest live bytes of its recompute and backward steps, less the retained bytes before it, with
        the held open tensors ``fa`` (per node of the region)."""
        return int((self.rows + fa).max())

    def exit_key(self, prog: Any, p: int, b: int, eff: frozenset) -> tuple[int, ...]:
        """The held open tensors after it: the plain region's (its forward holds the same tensors)."""
        return prog.region_nkey(eff, p, b)


class NestedRegions:
    """The nested variants of the regions of one program, their rows computed once each.

    Args:
        program: the :class:`~solvers.frontier.program.FrontierDP` of the graph.
    """

    def __init__(self, program: Any) -> None:
        self.prog = program
        self.graph = program.graph
        self._rows: dict[tuple[int, int], NestedRows | None] = {}
        self._sims: dict[tuple[int, int], tuple] | None = None  # of every usable span with child calls

    @property
    def any(self) -> bool:
        """Some span has child calls (a region may nest at all)."""
        g = self.graph
        return next((True for sp in g.spans if inner_menu(g, sp.first, sp.last)), False)

    def rows(self, p: int, b: int, terms: tuple) -> NestedRows | None:
        """The nested variant of ``[p, b]`` (None: no child calls); ``terms``: ``program.region_terms(p, kmax)``."""
        key = (p, b)
        if key in self._rows:
            return self._rows[key]
        if self._sims is None:
            self._sims = self._simulate_all()
        sims = self._sims.get(key)
        got = None if sims is None else self._combine(p, b, sims, terms)
        self._rows[key] = got
        return got

    def _simulate_all(self) -> dict[tuple[int, int], tuple]:
        """Per usable span with child calls: its steps read off ``simulate``, as few plans as disjoint layers
        allow (plain in one plan, nested in the other; the generator states the nested regions before a
        region retain are taken off its steps), as ``dp`` does (NOTE [ Nested regions in the chain
        decomposition ] in ``solvers.dp.nested``)."""
        from ..dp.nested import _layers

        graph, ends = self.graph, self.prog.span_ends
        spans = sorted((p, int(b)) for p in range(len(graph)) for b in ends[p] if inner_menu(graph, p, int(b)))
        costs = graph.recompute_costs()
        out: dict[tuple[int, int], tuple] = {}
        for layer in _layers(spans):
            self.prog.count(steps=2, elements=2 * SIMULATE_NODE_WORK * len(graph))  # two simulations
            inner = tuple(x for r in layer for x in inner_menu(graph, *r))
            plain = simulate(graph, Plan(regions=tuple(layer)))
            nest = simulate(graph, Plan(regions=tuple(layer), inner=inner))
            starts = [a for a, _ in layer]
            p_at = dict(zip(plain.steps, plain.live_bytes))
            steps: dict[tuple[int, int], list] = {r: [] for r in layer}
            extra = {r: 0 for r in layer}  # recompute cost of the nested steps less the plain ones
            for (phase, k), live in zip(nest.steps, nest.live_bytes):
                x = bisect.bisect_right(starts, k) - 1
                if x >= 0 and k <= layer[x][1]:
                    steps[layer[x]].append((phase, k, live))
                    extra[layer[x]] += costs[k] if phase == "recompute" else 0
            before = 0
            for r in layer:
                a, b = r
                rng = sum(region_rng_bytes(graph, inner_menu(graph, a, b)))
                p_rc = np.array([p_at[("recompute", k)] for k in range(a, b + 1)], dtype=np.int64)
                rows = [(phase, k, live - before - (p_at[(phase, k)] if phase == "forward" else 0))
                        for phase, k, live in steps[r]]
                out[r] = (p_rc, rows, rng, extra[r] - sum(costs[k] for k in range(a, b + 1)))
                before += rng
        return out

    def _combine(self, p: int, b: int, sims: tuple, terms: tuple) -> NestedRows:
        """NOTE [ Nested regions in the frontier DP ]: the rows of ``[p, b]`` from its simulated steps."""
        p_rc, steps, inner_rng, extra_cost = sims
        _, _, rc, cA, _, gr, cost, held, fwd, rng = terms
        i = b - p
        size = i + 1
        base = p_rc - (rc[:size] + int(gr[i]) + int(held[i]))
        back = np.full(size, NEG, dtype=np.int64)
        f = int(fwd[:size].max()) + int(rng[i])
        for phase, k, d in steps:
            if phase == "forward":  # d: the nested forward step less the plain one
                f = max(f, int(fwd[k - p]) + int(rng[i]) + d)
            else:
                back[k - p] = max(back[k - p], d - int(base[k - p]))
        return NestedRows(f, back, int(cA[i]) + inner_rng, int(cost[i]) + extra_cost)

    def extend(self, p: int, fr: Any, fronts: list, terms: tuple, cap: int, endok: np.ndarray | None,
               max_free: int | None) -> None:
        """Carry the front ``fr`` at ``p`` over every nested region ``[p, b]`` that fits.

        Args: as :meth:`~solvers.frontier.kept.KeptRegions.extend`.
        """
        from .kept import extend_variants

        def entries_at(b: int) -> list[NestedRows]:
            ent = self.rows(p, b, terms)
            return [] if ent is None else [ent]

        extend_variants(self.prog, p, fr, fronts, terms, cap, endok, max_free, entries_at,
                        lambda b, ent: NestedStep(b))
