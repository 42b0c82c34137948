"""The optimal dynamic program over a chain of stages: its table (``dp``, the solver, is in ``solvers.dp.solver``).

The graph is cut at its articulation points into a chain of stages
(``solvers.model.stages``); a plan is a sequence of segments (a stored stage, or a
region spanning consecutive stages) and its simulated peak decomposes, as the
note in ``solvers.dp.profiles`` (NOTE [ Decomposing the simulated peak over a chain ])
says, into ``const + max_s (R_before(s) + L(s))``.

Going right to left, a suffix plan starting at stage ``i`` is summarised by
``(h, cost)`` where ``h = max over its segments of (R between + L)``: putting
segment ``s`` in front gives ``(max(L(s), R(s) + h), cost(s) + cost)``. The
table holds, for every stage and boundary state, the Pareto set of these
pairs in exact integer bytes and FLOPs. It is filled once, without a budget;
any budget is then a binary search in the first set (:class:`DPTable`), and
the least feasible budget is its first entry. Each set is merged from its
candidates by a compiled kernel (``solvers.dp._kernel``, numba).

On a chain every node is a stage and the DP is optimal over all interval
plans (checked against brute force). On a DAG it is optimal over the plans
whose region boundaries are articulation cuts; common tensors are charged for
the whole step, so its prediction is an upper bound there. On a graph with
spans (NOTE [ Module-aligned regions ] in ``graphs.graph``) a region ``i..j``
is a candidate only when it is a span: the same table, optimal over the
span-only plans on a chain.

With ``selective`` (the default) every region candidate also comes with each
entry of its menu of kept sets (NOTE [ The menu of kept sets ] in
``solvers.model.selective``) as one more candidate segment, profiled as NOTE
[ Kept nodes in the chain decomposition ] (``solvers.dp.selective``) says:
the table is then optimal over ``(region, menu entry)`` pairs on a chain, and
a plan carries its kept nodes in ``saved``. A graph without saveable nodes
fills exactly the table it always did.

With ``nested`` every region candidate with child calls also comes nested
(NOTE [ Nested regions in the chain decomposition ] in ``solvers.dp.nested``):
the table is then optimal, on a chain, over plans whose regions are each
plain, keeping a menu entry, or nested with all of their child calls inside
(NOTE [ The menu of inner regions ] in ``solvers.model.nested``); a plan carries the
inner regions in ``inner``.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from graphs import Graph

from ..deadline import Deadline
from .work import _check_work, _paced, fill_work, last_regionable
from .fronts import Front as _Front, SuccessorBuffer as _SuccessorBuffer, thin as _thin
from .nested import NESTED_CODE, NestedRuns
from .kernel import kernel
from .profiles import NodeArrays, RegionRows, node_arrays, region_rng, stored_profile
from .selective import KeptRuns
from ..errors import InfeasibleBudget
from ..model.nested import inner_menu
from ..model.plan import Plan, Status
from ..model.simulate import simulate
from ..model.spans import SpanIndex
from ..model.stages import Stages, from_chain_view, stages

__all__ = ["DPTable", "Answer", "dp_table", "dp_answer", "fill_work", "DEFAULT_MAX_FRONT", "DEFAULT_TIME_LIMIT_S"]

log = logging.getLogger(__name__)

_CACHE: dict[str, "DPTable"] = {}
_CACHE_SIZE = 16
#: Default cap on Pareto-set sizes (see :func:`dp`); exact below it.
DEFAULT_MAX_FRONT = 256
#: ``dp``'s default wall-clock limit, as ``ilp``'s (NOTE [ dp under a time limit ] in ``solvers.dp.limited``).
DEFAULT_TIME_LIMIT_S = 60.0
#: A table filled against its deadline (``adapt``) sets its region length again every this many stages, aiming
#: to end at ``solvers.dp.work.ADAPT_MARGIN`` of the time left.
ADAPT_EVERY = 32


class DPTable:
    """The filled DP table of one graph; answer any budget with :meth:`solve`.

    Attributes:
        graph: the graph.
        stages: its stage chain.
        exact: True when the table's predictions equal ``simulate`` (no common
            tensors).
        is_chain: every node is a stage (the DP is over all interval plans).
        thinned: some Pareto set was capped at ``max_front`` (answers stay
            feasible, optimality is no longer guaranteed).
        capped: ``max_len`` left out some region (answers are optimal only
            over the regions of at most ``max_len`` stages: NOTE [ dp under a
            time limit ] in ``solvers.dp.limited``).
        selective: regions may keep nodes (see :func:`dp`).
        fill_time_s: seconds spent filling the table.
        compiled: the table was filled by numba's kernel (else by its plain-Python copy).

    Args:
        graph, max_front, selective: as for :func:`dp`.
        deadline: stop (:class:`~solvers.deadline.OutOfTime`) once it passes,
            and never wait for numba's kernel (NOTE [ The dp kernel under a
            deadline ] in ``solvers.dp.kernel``); None: no limit, wait for it.
        max_s: refuse, before filling, a table of more work (:func:`fill_work`)
            than the kernel at hand does in this many seconds of an idle core
            (``solvers.dp.kernel.WORK_PER_S``; ``OutOfTime`` by the work limit,
            the same on any machine); None: any.
        max_len: regions of at most this many stages (None: any length).
        adapt: with ``deadline`` and ``max_len``, ``max_len`` is where the
            fill starts: every :data:`ADAPT_EVERY` stages the length is
            lowered or raised so that the rest of the table fills by the
            deadline at the pace measured so far (NOTE [ dp under a time
            limit ]); :attr:`max_len` is then the longest used.
    """

    def __init__(self, graph: Graph, *, max_front: int | None = DEFAULT_MAX_FRONT, selective: bool = True,
                 deadline: Deadline | None = None, max_s: float | None = None, nested: bool = False,
                 max_len: int | None = None, adapt: bool = False) -> None:
        t0 = time.perf_counter()
        self.graph = graph
        self.max_front = max_front
        self.selective = selective
        self.nested = nested
        self.thinned = False
        self.stages: Stages = stages(graph)
        self._na: NodeArrays = node_arrays(graph, self.stages.common)
        self.const = self._na.const
        self.is_chain = len(self.stages) == len(graph)
        self.exact = not self.stages.common
        self.max_len = max_len
        self._adapt = adapt and deadline is not None and max_len is not None
        self.capped = not self._adapt and max_len is not None and fill_work(self.stages, max_len) < fill_work(
            self.stages)  # adapt: set as the table fills
        _check_work(self.stages, max_s, max_len)
        self._merge, self.compiled = kernel(wait=deadline is None)
        self._deadline = deadline
        self._fill()
        self.fill_time_s = time.perf_counter() - t0
        log.debug("dp table for %s: %d stages, %d entries at the root, %.3fs",
                  graph.name, len(self.stages), len(self.root.h), self.fill_time_s)

    # ------------------------------------------------------------------ filling
    def _fill(self) -> None:
        st, na = self.stages, self._na
        m = len(st)
        rows = RegionRows(na, st, self.graph.span_extra_bytes())  # NOTE [ Linear memory in dp ]
        ends = st.ends
        # Which boundary states each stage can be entered with.
        bnd = list(st.boundary[1:]) + [ends[-1]]  # the tensor crossing out of each stage
        lh_reg = [int(bool(na.sink[q]) or int(na.out[q]) == 0) for q in bnd]
        stored = {}
        need: list[set[int]] = [set() for _ in range(m + 1)]
        need[0].add(1)
        # See NOTE [ Kept nodes in the chain decomposition ] in solvers.dp.selective
        kept = KeptRuns(self.graph, na, st, lh_reg, bnd, self.graph.span_extra_bytes()) if self.selective else None
        if kept is not None and not kept.any:
            kept = None
        self._kept = kept
        nest = None
        if self.nested:  # NOTE [ Nested regions in the chain decomposition ] in solvers.dp.nested
            span_ends0 = SpanIndex(self.graph).ends
            lmax0 = last_regionable(st, self.max_len)
            cands = []
            if span_ends0 is not None:
                stage_of = {e: s for s, e in enumerate(ends)}
                for i in range(m):
                    for b in span_ends0[st.starts[i]].tolist():
                        j = stage_of.get(b, -1)
                        if i <= j <= lmax0[i]:
                            cands.append((st.starts[i], b))
            nest = NestedRuns(self.graph, cands)
            if not nest.any:
                nest = None
        self._nest = nest
        empty = _Front(np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, -2), np.zeros(1, np.int64))
        fronts: dict[tuple[int, int], _Front] = {(m, 0): empty, (m, 1): empty}
        for i in range(m):
            if self._deadline is not None and not i % 256:  # a pass over the stages: seconds on a long chain
                self._deadline.check("dp's table")
            for lh in (0, 1):
                stored[i, lh] = stored_profile(na, st.starts[i], ends[i], lh, p=st.boundary[i] if i else None,
                                               q=bnd[i])
        for i in range(1, m + 1):
            need[i].add(stored[i - 1, 1][2])
            need[i].add(stored[i - 1, 0][2])
            if st.regionable[i - 1]:
                need[i].add(lh_reg[i - 1])
            if kept is not None and kept.needs_lh1[i - 1]:
                need[i].add(1)
        merge_stage, deadline = self._merge, self._deadline
        buf = _SuccessorBuffer(2 * m if kept is not None else m)  # m + j: the set after j entered in state 1
        lmax = last_regionable(st, None if self._adapt else self.max_len)
        cap, longest, paced = self.max_len or m, 0, (deadline.clock(), m) if self._adapt else (0.0, m)
        span_ends = SpanIndex(self.graph).ends  # None: any stages i..j may form a region
        no_ret = np.zeros(m, np.int64)
        stage_of_end = {e: s for s, e in enumerate(ends)}
        for i in range(m - 1, -1, -1):
            if deadline is not None:  # every stage: a stage of a long chain is up to its length of work
                deadline.check("dp's table")
                if self._adapt and paced[1] - i >= ADAPT_EVERY:  # NOTE [ dp under a time limit ]
                    cap, paced = _paced(cap, paced, i, deadline, m)
            if st.regionable[i]:
                buf.push(i, fronts[i + 1, lh_reg[i]])
                if kept is not None and kept.needs_lh1[i]:
                    buf.push(m + i, fronts[i + 1, 1])
            jmax = int(lmax[i])
            if self._adapt and jmax >= i:
                self.capped |= jmax > i + cap - 1
                jmax = min(jmax, i + cap - 1)
                longest = max(longest, jmax - i + 1)
            l0, cost = rows.row(i, jmax) if jmax >= i else (no_ret[:0], no_ret[:0])
            if span_ends is None:
                js = np.arange(i, jmax + 1, dtype=np.int64)
                floor, run_cost = l0, cost
            else:  # NOTE [ Module-aligned regions ]: only the regions i..j that are spans
                js = np.array([j for b in span_ends[st.starts[i]].tolist()
                               if (j := stage_of_end.get(b, -1)) >= i and j <= jmax], dtype=np.int64)
                floor, run_cost = np.ascontiguousarray(l0[js - i]), np.ascontiguousarray(cost[js - i])
            segs, ret, code = js, no_ret[:len(js)], js
            if na.rng:  # NOTE [ RNG state per region ]: a stochastic region retains the generator state
                ret = np.ascontiguousarray(region_rng(na, st.starts[i], np.asarray(ends, dtype=np.int64)[js]))
            if kept is not None:  # the same regions keeping each entry of their menus, after the plain ones
                k_segs, k_floor, k_cost, k_ret, k_code = kept.runs(i, js, run_cost)
                if len(k_segs):
                    segs, ret, code = (np.concatenate((x, y)) for x, y in ((js, k_segs), (ret, k_ret), (js, k_code)))
                    floor = np.concatenate((floor, k_floor))
                    run_cost = np.concatenate((run_cost, k_cost))
            if nest is not None:  # the plain regions once more, nested, after the others
                n_segs, n_floor, n_cost, n_ret, n_code = nest.runs(i, st.starts[i], ends, js, floor[:len(js)],
                                                                   run_cost[:len(js)], ret[:len(js)], m)
                if len(n_segs):
                    segs, ret, code = (np.concatenate((x, y)) for x, y in ((segs, n_segs), (ret, n_ret),
                                                                           (code, n_code)))
                    floor = np.concatenate((floor, n_floor))
                    run_cost = np.concatenate((run_cost, n_cost))
            for lh in sorted(need[i]):
                local, retained, nlh = stored[i, lh]
                nf = fronts[i + 1, nlh]
                # The stored option and every region i..j at once, each region read
                # from the entry of its successor front at or just below its floor
                # (all below collapse to the floor; only the cheapest of them can be
                # on the front). NOTE [ Filtering a stage's candidates by the front
                # so far ] in ``solvers.dp._kernel``.
                extra = rows.inp(i) if lh == 0 else 0
                front = _Front(*merge_stage(local, retained, nf.h, nf.cost, buf.h, buf.c, buf.seg_start,
                                            buf.seg_end, segs, floor, run_cost, ret, code, extra))
                if self.max_front is not None and len(front.h) > self.max_front:
                    front = _thin(front, self.max_front)
                    self.thinned = True
                fronts[i, lh] = front
        if self._adapt:
            log.info("dp table paced by its deadline: regions of up to %d stages (%d at the first stage)", longest, cap)
            self.max_len = longest
        self._fronts = fronts
        self._lh_reg = lh_reg
        self._stored = stored
        self.root = fronts[0, 1]

    # ------------------------------------------------------------------ queries
    @property
    def min_peak_bytes(self) -> int:
        """The least peak of any plan the DP considers (its least feasible budget)."""
        return self.const + int(self.root.h[0])

    def frontier(self) -> list[tuple[int, int]]:
        """``(predicted peak, recompute cost)`` for every point of the root front."""
        return [(self.const + int(h), int(c)) for h, c in zip(self.root.h, self.root.cost)]

    def solve(self, budget_bytes: int) -> "Answer":
        """The cheapest plan whose predicted peak fits ``budget_bytes``.

        Returns:
            ``(regions, predicted peak, recompute cost)`` with the kept nodes
            as ``.saved`` (:class:`Answer`).

        Raises:
            InfeasibleBudget: carrying :attr:`min_peak_bytes`.
        """
        root = self.root
        idx = int(np.searchsorted(root.h, budget_bytes - self.const, side="right")) - 1
        if idx < 0:
            least = self.plan_at(0)
            raise InfeasibleBudget(budget_bytes, self.min_peak_bytes, solver="dp", best_regions=least[0],
                                   best_inner=least.inner, best_saved=least.saved)
        return self.plan_at(idx)

    def plan_at(self, idx: int) -> "Answer":
        """The plan of the root front's entry ``idx``: ``(regions, predicted peak, cost)``, ``.saved``."""
        root = self.root
        regions = []
        saved: list[int] = []
        inner: list[tuple[int, int]] = []
        i, lh = 0, 1
        front = root
        at = idx
        m = len(self.stages)
        while i < m:
            choice = int(front.choice[at])
            nxt = int(front.nxt[at])
            if choice == -1:
                lh = self._stored[i, lh][2]
                i += 1
            else:
                j, v = choice % m, choice // m  # v: the entry of the region's menu (0: keep nothing)
                regions.append((self.stages.starts[i], self.stages.ends[j]))
                if v == NESTED_CODE:  # NOTE [ Nested regions in the chain decomposition ]
                    inner.extend(inner_menu(self.graph, *regions[-1]))
                    lh = self._lh_reg[j]
                elif v:
                    kept, lh = self._kept.entry(i, j, v)
                    saved.extend(kept)
                else:
                    lh = self._lh_reg[j]
                i = j + 1
            front = self._fronts[i, lh]
            at = nxt
        return Answer(tuple(regions), self.const + int(root.h[idx]), int(root.cost[idx]), tuple(saved), tuple(inner))


class Answer(tuple):
    """A plan read from the table: the triple ``(regions, predicted peak,
    recompute cost)`` with the kept nodes (selective recompute) as :attr:`saved`
    and the inner regions (nested regions) as :attr:`inner`."""

    saved: tuple[int, ...]
    inner: tuple[tuple[int, int], ...]

    def __new__(cls, regions, peak: int, cost: int, saved: tuple[int, ...] = (),
                inner: tuple[tuple[int, int], ...] = ()) -> "Answer":
        self = super().__new__(cls, (regions, peak, cost))
        self.saved = tuple(saved)
        self.inner = tuple(inner)
        return self


def dp_table(graph: Graph, *, max_front: int | None = DEFAULT_MAX_FRONT, selective: bool = True,
             deadline: Deadline | None = None, max_s: float | None = None, nested: bool = False,
             max_len: int | None = None, adapt: bool = False) -> DPTable:
    """The DP table of ``graph``, cached by content (a budget sweep fills it once).

    Args:
        graph: the graph.
        max_front: see :func:`dp`.
        selective: see :func:`dp`.
        nested: see :func:`dp`.
        deadline, max_s, max_len: see :class:`DPTable` (a table found in the cache is held to ``max_s`` all
            the same).

    Returns:
        The filled :class:`DPTable`.

    Raises:
        OutOfTime: the table was not filled within ``deadline`` or ``max_work``.
    """
    # costs included: fingerprints leave them out
    key = f"{graph.content_hash()}:{max_front}:{bool(selective)}:{max_len}" + (":nested" if nested else "")
    if adapt and deadline is not None and max_len is not None:  # paced by the clock: not cached
        return DPTable(graph, max_front=max_front, selective=selective, deadline=deadline, max_s=max_s,
                       nested=nested, max_len=max_len, adapt=True)
    table = _CACHE.get(key)
    if table is not None:
        _check_work(table.stages, max_s, max_len)  # as if it were not cached: the answer does not depend on earlier calls
    else:
        table = DPTable(graph, max_front=max_front, selective=selective, deadline=deadline, max_s=max_s,
                        nested=nested, max_len=max_len)
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = table
    return table


def dp_answer(graph: Graph, table: DPTable, budget_bytes: int, deadline: Deadline | None = None, *,
              check: Graph | None = None) -> Plan:
    """:func:`dp`'s plan from a filled table (``deadline``: the simulations of an inexact table's answers stop
    when it passes). ``check``: the graph whose chain view ``graph`` is, on which answers are simulated (NOTE
    [ Chains and forward holds ] in ``solvers.model.stages``)."""
    if check is not None:
        return _dp_checked(check, table, budget_bytes, deadline)
    if not table.exact:
        return _dp_inexact(graph, table, budget_bytes, deadline)
    answer = table.solve(budget_bytes)
    regions, peak, cost = answer
    optimal = table.is_chain and table.exact and not table.thinned and not table.capped
    return Plan(regions=regions, saved=answer.saved, inner=answer.inner,
                status=Status.OPTIMAL if optimal else Status.FEASIBLE,
                bound=float(cost) if optimal else None,
                options={"stages": len(table.stages), "predicted_peak_bytes": peak})


#: Front entries above the budget that ``dp`` simulates when its predictions
#: are upper bounds (common tensors): their real peak may still fit.
RESCUE = 16
#: Front entries at or below the budget that ``dp`` simulates on a graph with forward holds, whose peaks on the
#: chain view are lower bounds (NOTE [ Chains and forward holds ] in ``solvers.model.stages``).
HOLD_SCAN = 64


def _dp_checked(graph: Graph, table: DPTable, budget_bytes: int, deadline: Deadline | None) -> Plan:
    """``dp`` on ``graph``'s chain view: down the front from the budget (dearer plans, lower peaks on the view),
    the first whose peak on ``graph`` fits; the view's least plan last. Feasible, never optimal."""
    idx = int(np.searchsorted(table.root.h, budget_bytes - table.const, side="right")) - 1
    least = None
    for at in list(range(idx, max(idx - HOLD_SCAN, 0), -1)) + [0]:
        if least is not None and deadline is not None and deadline.left() < deadline.pass_estimate(len(graph)):
            break  # no time for one more simulation (NOTE [ dp under a time limit ])
        answer = table.plan_at(at)
        plan = Plan(regions=from_chain_view(graph, answer[0]), saved=answer.saved,
                    inner=from_chain_view(graph, answer.inner))
        peak = simulate(graph, plan, record=False).peak_bytes
        if peak <= budget_bytes:
            return Plan(regions=plan.regions, saved=plan.saved, inner=plan.inner, status=Status.FEASIBLE, bound=None,
                        options={"stages": len(table.stages), "predicted_peak_bytes": peak})
        if least is None or peak < least[0]:
            least = (peak, plan)
    peak, plan = least  # type: ignore[misc]
    raise InfeasibleBudget(budget_bytes, peak, solver="dp", best_regions=plan.regions, best_inner=plan.inner,
                           best_saved=plan.saved, proven=False, lower_bound_bytes=table.min_peak_bytes,
                           scope="the plans dp considers (ilp searches every interval plan)")


def _dp_inexact(graph: Graph, table: DPTable, budget_bytes: int, deadline: Deadline | None = None) -> Plan:
    """``dp`` when common tensors make the table's peaks upper bounds: the
    cheapest of the predicted fit and the next :data:`RESCUE` front entries
    whose *simulated* peak fits (so store-all at a budget it fits is found)."""
    root = table.root
    idx = int(np.searchsorted(root.h, budget_bytes - table.const, side="right")) - 1
    best = None
    # A nested region's profile is read off simulate at one context (NOTE [ Nested regions in the chain
    # decomposition ]): off a chain it is no upper bound, so every nested answer is simulated too.
    for at in range(max(idx, 0), min(len(root.h), max(idx, 0) + RESCUE + 1)):
        if at > max(idx, 0) and deadline is not None and deadline.left() < deadline.pass_estimate(len(graph)):
            break  # no time for one more simulation (NOTE [ dp under a time limit ])
        answer = table.plan_at(at)
        if (at > idx or answer.inner) and simulate(graph, Plan(regions=answer[0], saved=answer.saved,
                                                               inner=answer.inner),
                                                   record=False).peak_bytes > budget_bytes:
            continue
        if best is None or answer[2] < best[2]:
            best = answer
    if best is None:
        least = table.plan_at(0)
        raise InfeasibleBudget(budget_bytes, table.min_peak_bytes, solver="dp", best_regions=least[0],
                               best_inner=least.inner, best_saved=least.saved)
    regions, peak, cost = best
    return Plan(regions=regions, saved=best.saved, inner=best.inner, status=Status.FEASIBLE, bound=None,
                options={"stages": len(table.stages), "predicted_peak_bytes": peak})
