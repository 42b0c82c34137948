"""The CP-SAT model behind ``ilp`` (NOTE [ An exact model of simulate ] in ``solvers.ilp``)."""

from __future__ import annotations

import logging
import math

from ortools.sat.python import cp_model

from graphs import Graph

from .run import STOP_GRACE_S, ModelResult, Progress, new_solver, run_cp_sat
from ..deadline import Deadline, OutOfTime
from ..dp.profiles import node_arrays
from .cuts import add_knapsack_rows, region_literals
from .rng import rng_counts
from .same import SameLiterals
from ..model.spans import SpanIndex
from ..model.terms import INF, terms_of

__all__ = ["CheckpointModel", "ModelResult"]

log = logging.getLogger(__name__)

#: Seconds of garbage collection a model's objects take, per second spent building it (3.7 s after 35 s here);
#: the build stops while that much is left; a search leaves that much of the deadline (NOTE [ What follows a search ]).
CLEANUP_SHARE = 0.15


class CheckpointModel:
    """The model of one graph: variables, constraints, objective; then :meth:`solve`.

    Args:
        graph: the cost graph.
        budget_bytes: whole-step budget; ``None`` minimises the peak instead
            of the recompute FLOPs.
        deadline: building stops (:class:`~solvers.deadline.OutOfTime`) once it
            passes (NOTE [ One deadline ]: a 700-node DAG takes seconds to build),
            less what follows the model (NOTE [ What follows a search ]).

    NOTE [ What follows a search ]
        Every phase that works on the model (building it, completing the
        hint, the knapsack cuts, the search) keeps back of the deadline what
        must still run after it: the read-out (``Deadline.read_out_s``), the
        garbage collection of the model (:data:`CLEANUP_SHARE` of the
        seconds spent building it: a 20,000-node chain's model, built in
        8.5 s, left a 0.7 s collection), and, for a search, the
        :data:`~solvers.cpsat.run.STOP_GRACE_S` a search told to stop may
        take before it is left running (NOTE [ CP-SAT past its time limit ]).
        :meth:`search_left` is what a search may take now; a search is told
        to stop once it is 0. A search that ignored its own
        ``max_time_in_seconds`` was once stopped only at the deadline itself
        and left running half a second later, after which came the read-out
        and the model's collection: ``ilp`` on a 20,000-node chain at a load
        of 8 returned 1.6 s past its 60 s limit, the command 3.0 s past it.
        The knapsack cuts (NOTE [ Knapsack cuts from store-all ]) are made
        and added row by row, each started only while a row's time is left
        (64 rows took 7 s on that chain, unchecked).
    """

    def __init__(self, graph: Graph, *, budget_bytes: int | None, deadline: Deadline | None = None) -> None:
        self.graph = graph
        self.deadline = deadline
        self._built_from = deadline.clock() if deadline is not None else 0.0
        self.build_s = 0.0  # seconds spent building, once built (what freeing the model takes follows from it)
        self.m = cp_model.CpModel()
        self._na = node_arrays(graph, frozenset())  # exact: no common-tensor shortcut here
        # The objective in units of the FLOPs' common divisor (exact; CP-SAT's
        # bound rounds up to whole units, which closes gaps on its own).
        self.unit = (math.gcd(*graph.recompute_costs()) or 1) if budget_bytes is not None else 1
        self._variables()
        self._same = SameLiterals(graph, self.m, self.x, self.cont, self.z, tick=self._tick)
        self._constraints(budget_bytes)
        self._objective(budget_bytes)
        if deadline is not None:
            self.build_s = deadline.clock() - self._built_from

    # ------------------------------------------------------------- variables
    def _variables(self) -> None:
        g, m = self.graph, self.m
        n = len(g)
        self.x = [m.NewBoolVar(f"x{k}") for k in range(n)]  # node k is in a region
        self.y = [m.NewBoolVar(f"y{k}") for k in range(n)]  # a region starts at k
        self.cont = [m.NewConstant(0)] + [m.NewBoolVar(f"cont{k}") for k in range(1, n)]  # k continues k-1's region
        for k in range(n):
            self._tick()
            if not g.nodes[k].recomputable:
                m.Add(self.x[k] == 0)
            m.AddImplication(self.y[k], self.x[k])
            if k == 0:
                m.Add(self.y[0] == self.x[0])
                continue
            m.AddBoolOr([self.x[k].Not(), self.x[k - 1], self.y[k]])  # region entered: it starts here
            c = self.cont[k]
            m.AddImplication(c, self.x[k])
            m.AddImplication(c, self.y[k].Not())
            m.AddBoolOr([self.x[k].Not(), self.y[k], c])
        self.z: dict[tuple[int, int], cp_model.IntVar] = {}  # span (a, b) is a region (aligned graphs)
        self.held_extra: list[list] = [[] for _ in range(n)]  # extra_bytes * z of the spans holding k
        if g.spans:
            self._aligned()

    def _aligned(self) -> None:
        """Regions are spans (NOTE [ Module-aligned regions ] in ``graphs.graph``):
        one bool per usable span, and ``x``, ``y``, ``cont`` the sums of the
        chosen spans that hold ``k``, start at ``k``, and hold ``k`` past
        their first node. Linear equalities, so CP-SAT's LP sees them too
        (given ``x`` and the clauses that tie it to ``y`` and ``cont``, either
        of the last two implies the other; both are kept for the LP)."""
        m, n = self.m, len(self.graph)
        holds: list[list] = [[] for _ in range(n)]
        starts: list[list] = [[] for _ in range(n)]
        inner: list[list] = [[] for _ in range(n)]
        span_extra = self.graph.span_extra_bytes()
        for a, b in SpanIndex(self.graph).spans:
            z = self.z[a, b] = m.NewBoolVar(f"z{a}_{b}")
            starts[a].append(z)
            if (a, b) in span_extra:  # eager lifetimes: held at every recompute step of the region
                for k in range(a, b + 1):
                    self.held_extra[k].append(span_extra[a, b] * z)
            for k in range(a, b + 1):
                holds[k].append(z)
                if k > a:
                    inner[k].append(z)
        for k in range(n):
            m.Add(self.x[k] == sum(holds[k]))
            m.Add(self.y[k] == sum(starts[k]))
            if k:
                m.Add(self.cont[k] == sum(inner[k]))

    def _after_s(self, built_s: float) -> float:
        """Seconds kept back at the end of the deadline for what follows the model: the read-out and freeing
        what ``built_s`` seconds of building made (NOTE [ What follows a search ])."""
        assert self.deadline is not None
        return self.deadline.read_out_s(len(self.graph)) + CLEANUP_SHARE * built_s

    def search_left(self) -> float:
        """Seconds a search (or a run of the cuts) may take now: what the deadline leaves less what follows the
        model and the grace a search told to stop has (NOTE [ What follows a search ]); ``inf`` without one."""
        if self.deadline is None:
            return math.inf
        return self.deadline.left() - self._after_s(self.build_s) - STOP_GRACE_S

    def _stop_search(self) -> bool:
        """Whether a running search must be told to stop (NOTE [ CP-SAT past its time limit ] in ``run``)."""
        return self.deadline is not None and self.search_left() <= 0

    def _tick(self, k: int = 0) -> None:
        """Stop building once the deadline less the read-out has passed (looked at every step of each phase), or
        once what is left would not free what was built: a model stopped after 35 s of building on a 5,000-node
        DAG left 3.7 s of garbage collection past its 60 s limit (:data:`CLEANUP_SHARE`, NOTE [ What follows a
        search ])."""
        d = self.deadline
        if d is not None and (d.expired() or d.left() < self._after_s(d.clock() - self._built_from)):
            raise OutOfTime(f"building the CP-SAT model of {len(self.graph)} nodes stopped at the "
                            f"{self.deadline.limit_s:g} s time limit")

    def same(self, j: int, t: int):
        """Literal: ``j <= t`` lie in one region (NOTE [ Building same(j, t) ])."""
        return self._same(j, t)

    # ----------------------------------------------------------- constraints
    def _constraints(self, budget_bytes: int | None) -> None:
        """The budget at every step of ``simulate``, built in phases: the
        capacity, which forward copies stay held, the running sums along a
        region, the snapshots, then one row per forward, recompute and
        backward step."""
        na = self._na
        self._out = [int(v) for v in na.out]
        self._own = [int(v) for v in na.own]
        self._cur = [int(v) for v in na.cur]
        self._terms = terms_of(self.graph)
        self._capacity(budget_bytes)
        self._held()
        self._running_sums()
        self._snapshots()
        self._recomputed_unsaved()
        self._step_rows()

    def _capacity(self, budget_bytes: int | None) -> None:
        """``cap``: the bytes left for activations (a variable when the peak is minimised);
        ``hi``: a bound on every sum below."""
        g, na = self.graph, self._na
        total = (sum(self._out) * 4 + sum(self._cur) + sum(self._own) + int(na.state.sum())
                 + int(max(na.gb.max(), na.gr.max())) + 1)
        total += sum(g.span_extra_bytes().values())
        if any(nd.stochastic for nd in g.nodes):
            total += int(g.rng_state_bytes) * (len(g) + 2)  # NOTE [ RNG state per region ]
        const = g.param_bytes + g.input_bytes
        if budget_bytes is None:
            self.cap = self.m.NewIntVar(0, total, "peak")
        else:
            self.cap = budget_bytes - const
        self._hi = total

    def _held(self) -> None:
        """``held[j]``: the forward copy of ``j`` is held after its last forward consumer.

        The caller's tensors (``Terms.sinks``: unread outputs, and the outputs
        of a ``"held"`` loop, read or not) are held from their forward step
        on: they enter ``hb`` there and are no open tensor of any row."""
        m, x, t = self.m, self.x, self._terms
        self._held_after: list = []
        for j in range(len(self.graph)):
            self._tick(j)
            if t.sinks[j]:
                self._held_after.append(m.NewConstant(1))
                continue
            h = m.NewBoolVar(f"held{j}")
            if t.self_save[j]:
                m.AddImplication(x[j].Not(), h)
            for c in t.savers[j]:
                m.AddImplication(x[c].Not(), h)
            for c in self.graph.succs[j]:
                m.AddBoolOr([x[c].Not(), self.same(j, c), h])  # a region reading j, without j
            self._held_after.append(h)

    def _forward_alive(self, j: int, k: int):
        """The forward copy of j (j <= k < lc[j]) at k's recompute/backward."""
        self._tick()
        m, x, t = self.m, self.x, self._terms
        f = m.NewBoolVar(f"fa{j}_{k}")
        if t.self_save[j]:
            m.AddImplication(x[j].Not(), f)
        for c in t.savers[j]:
            if c <= k:
                m.AddImplication(x[c].Not(), f)
        for c in self.graph.succs[j]:
            if c <= k:
                m.AddBoolOr([x[c].Not(), self.same(j, c), f])
            else:
                m.AddBoolOr([self.same(k, c).Not(), self.same(j, c), f])
        return f

    def _running_sums(self) -> None:
        """Sums carried along the order: ``hb`` (held forward copies), ``sx`` (own
        buffers of stored nodes), ``s_``/``ow`` (recomputed saved copies and own
        buffers earlier in k's region), ``e_`` (gradients at the end of k's region)."""
        m, n, hi, cont, na = self.m, len(self.graph), self._hi, self.cont, self._na
        out, own, x = self._out, self._own, self.x
        lc, fs, held = self._open_until(), self._terms.first_saver, self._held_after
        enter = [[] for _ in range(n)]
        for j in range(n):
            enter[max(j, lc[j])].append(j)
        hb, sx, s_, ow, e_ = [], [], [], [], [None] * n
        by_saver = [[] for _ in range(n + 1)]
        for j in range(n):
            if fs[j] < INF and fs[j] > j:
                by_saver[fs[j]].append(j)
        for k in range(n):
            self._tick(k)
            v = m.NewIntVar(0, hi, f"hb{k}")  # sum of out[j] held[j], j <= k, lc[j] <= k
            m.Add(v == (hb[-1] if hb else 0) + sum(out[j] * held[j] for j in enter[k]))
            hb.append(v)
            v = m.NewIntVar(0, hi, f"sx{k}")  # own buffers of stored nodes <= k
            m.Add(v == (sx[-1] if sx else 0) + own[k] - own[k] * x[k])
            sx.append(v)
            v = m.NewIntVar(0, hi, f"s{k}")  # recomputed saved copies of j < k in k's region
            w = m.NewIntVar(0, hi, f"ow{k}")  # recomputed own buffers of j < k in k's region
            if k == 0:
                m.Add(v == 0)
                m.Add(w == 0)
            else:
                extra = sum(out[j] * self.same(j, k - 1) for j in by_saver[k] if j < k - 1)
                last = out[k - 1] if fs[k - 1] <= k else 0
                m.Add(v == s_[-1] + extra + last).OnlyEnforceIf(cont[k])
                m.Add(v == 0).OnlyEnforceIf(cont[k].Not())
                m.Add(w == ow[-1] + own[k - 1]).OnlyEnforceIf(cont[k])
                m.Add(w == 0).OnlyEnforceIf(cont[k].Not())
            s_.append(v)
            ow.append(w)
        for k in range(n - 1, -1, -1):  # gradients at the end of k's region
            v = m.NewIntVar(0, hi, f"e{k}")
            if k + 1 < n:
                m.Add(v == e_[k + 1]).OnlyEnforceIf(cont[k + 1])
                m.Add(v == int(na.gr[k])).OnlyEnforceIf(cont[k + 1].Not())
            else:
                m.Add(v == int(na.gr[k]))
            e_[k] = v
        self._hb, self._sx, self._s, self._ow, self._e = hb, sx, s_, ow, e_

    def _open_until(self) -> list[int]:
        """Per tensor, its last forward reader while its forward copy is open; -1 for the caller's
        tensors (held from their forward step: :meth:`_held`)."""
        t = self._terms
        return [-1 if t.sinks[j] else t.last_reader[j] for j in range(len(self.graph))]

    def _snapshots(self) -> None:
        """Buffers of stateful nodes, snapshotted for a region's whole recompute:
        ``snap[k] = sl[k]`` (those at or before k in k's region) ``+ sr[k]`` (after k in it)."""
        m, n, hi, cont = self.m, len(self.graph), self._hi, self.cont
        state = [int(v) for v in self._na.state]
        snap: list = [0] * n
        if any(state):
            sl, sr = [None] * n, [None] * n
            for k in range(n):
                v = m.NewIntVar(0, hi, f"sl{k}")
                if k == 0:
                    m.Add(v == state[0])
                else:
                    m.Add(v == sl[k - 1] + state[k]).OnlyEnforceIf(cont[k])
                    m.Add(v == state[k]).OnlyEnforceIf(cont[k].Not())
                sl[k] = v
            for k in range(n - 1, -1, -1):
                v = m.NewIntVar(0, hi, f"sr{k}")
                if k + 1 < n:
                    m.Add(v == sr[k + 1] + state[k + 1]).OnlyEnforceIf(cont[k + 1])
                    m.Add(v == 0).OnlyEnforceIf(cont[k + 1].Not())
                else:
                    m.Add(v == 0)
                sr[k] = v
            snap = [sl[k] + sr[k] for k in range(n)]
        self._snap = snap

    def _recomputed_unsaved(self) -> None:
        """``q[k]``: recomputed copies of j < k not yet saved at k, in k's region.

        Such a copy is alive at k's recompute exactly when j is in k's region
        while a reader or saver at or after k needs it, or (that reader outside
        the region) the region still references it as an output; the caller's
        tensors are outputs to the end. So j counts for k in (j, last[j]], and a running
        sum along the region drops it after last[j] (one ``same`` per j).
        """
        m, n, hi, cont, out = self.m, len(self.graph), self._hi, self.cont, self._out
        lc, fs = self._open_until(), self._terms.first_saver
        last = [min(lc[j] if lc[j] >= 0 else n - 1, fs[j] - 1) for j in range(n)]
        leaving = [[] for _ in range(n + 1)]
        for j in range(n):
            if last[j] > j:
                leaving[last[j] + 1].append(j)
        q = []
        for k in range(n):
            self._tick(k)
            v = m.NewIntVar(0, hi, f"q{k}")
            if k == 0:
                m.Add(v == 0)
            else:
                gone = sum(out[j] * self.same(j, k - 1) for j in leaving[k])  # j < k - 1: last[j] > j
                enters = out[k - 1] if last[k - 1] >= k else 0
                m.Add(v == q[-1] - gone + enters).OnlyEnforceIf(cont[k])
                m.Add(v == 0).OnlyEnforceIf(cont[k].Not())
            q.append(v)
        self._q = q

    def _step_rows(self) -> None:
        """One row per step of ``simulate``: the forward of k, its recompute (when
        ``x[k]``) and its backward (when it requires grad), each within ``cap``."""
        g, m, n, na, x = self.graph, self.m, len(self.graph), self._na, self.x
        out, own, cur, t = self._out, self._own, self._cur, self._terms
        lc, sinks_after = self._open_until(), t.sink_bytes_after
        hb, sx, s_, ow, e_, q, snap = self._hb, self._sx, self._s, self._ow, self._e, self._q, self._snap
        open_fwd = [0] * n  # sum of out[j], j < k <= lc[j]
        for j in range(n):
            for k in range(j + 1, lc[j] + 1):
                open_fwd[k] += out[j]
        spans = [[] for _ in range(n)]  # j <= k < lc[j]
        for j in range(n):
            for k in range(j, lc[j]):
                spans[k].append(j)
        rng, rs, sr = rng_counts(self)  # NOTE [ RNG state per region ]
        for k in range(n):
            self._tick(k)
            # Forward step k.
            m.Add(open_fwd[k] + (hb[k - 1] if k else 0) + (sx[k - 1] if k else 0) + cur[k] + rng * rs[k]
                  + self._extra(k, 0) <= self.cap)
            fa = sum(out[j] * self._forward_alive(j, k) for j in spans[k])
            # Recompute step k (exists when x[k]).
            rc = s_[k] + q[k] + self._extra(k, 1)
            if self.held_extra[k]:  # eager lifetimes: the extra bytes of the one chosen span holding k
                rc = rc + sum(self.held_extra[k])
            m.Add(hb[k] + fa + sinks_after[k + 1] + e_[k] + rc + sx[k] + ow[k] + cur[k] + snap[k]
                  + rng * rs[k] + rng * sr[k] <= self.cap).OnlyEnforceIf(x[k])
            # Backward step k.
            if g.nodes[k].requires_grad:
                a = s_[k] + (out[k] * x[k] if t.self_save[k] else 0) + self._extra(k, 2)
                m.Add(hb[k] + fa + sinks_after[k + 1] + int(na.gb[k]) + a + sx[k] + ow[k] + own[k] * x[k]
                      + rng * rs[k] <= self.cap)

    def _extra(self, k: int, phase: int):
        """Bytes added to step k's row (phase 0/1/2: forward/recompute/backward); kept nodes (``solvers.cpsat.kept``)."""
        return 0

    # ------------------------------------------------------------- objective
    def _objective(self, budget_bytes: int | None) -> None:
        if budget_bytes is None:
            self.m.Minimize(self.cap)
        else:
            self.m.Minimize(self._flops())

    def _flops(self):
        """Recompute FLOPs of the plan, in :attr:`unit`."""
        return sum((c // self.unit) * self.x[k] for k, c in enumerate(self.graph.recompute_costs()))

    # ----------------------------------------------------------------- hints
    def add_hint(self, regions, *, complete_s: float = 0.0, complete_work: float | None = None) -> bool:
        """Warm start from a plan.

        Hints the region variables; with ``complete_s > 0`` first solves a copy
        of the model with them fixed (pure propagation, well under a second on
        700 nodes) and hints *every* variable, so that CP-SAT starts from a
        complete solution and its neighbourhood searches can improve it at
        once (an incomplete hint on a large model is often never completed).

        Args:
            complete_work: a deterministic limit on that completion (CP-SAT's
                ``max_deterministic_time``), so that whether it completes does
                not depend on the machine's load (NOTE [ Deterministic CP-SAT ]
                in ``solvers.cpsat.solver``); ``complete_s`` stays a safety net.

        Returns:
            True when the complete hint was found.
        """
        starts = {a for a, _ in regions}
        inside = {i for a, b in regions for i in range(a, b + 1)}
        if complete_s > 0:
            copy = self.m.Clone()
            for k in range(len(self.graph)):
                copy.Add(copy.GetBoolVarFromProtoIndex(self.x[k].Index()) == int(k in inside))
                copy.Add(copy.GetBoolVarFromProtoIndex(self.y[k].Index()) == int(k in starts))
            copy.ClearObjective()
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = float(complete_s)
            if complete_work is not None:
                solver.parameters.max_deterministic_time = float(complete_work)
            solver.parameters.num_workers = 1
            if run_cp_sat(solver, copy, expired=self._stop_search) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                for i in range(len(self.m.Proto().variables)):
                    self.m.AddHint(self.m.GetIntVarFromProtoIndex(i), solver.Value(copy.GetIntVarFromProtoIndex(i)))
                return True
            log.warning("ilp: could not complete the warm-start hint in %.1fs; hinting the regions only", complete_s)
        for k in range(len(self.graph)):
            self.m.AddHint(self.x[k], k in inside)
            self.m.AddHint(self.y[k], k in starts)
        chosen = {tuple(r) for r in regions}
        for span, z in self.z.items():
            self.m.AddHint(z, span in chosen)
        return False

    def add_lower_bound(self, flops: int) -> None:
        """The recompute FLOPs are at least ``flops`` (a bound proven elsewhere)."""
        self.m.Add(self._flops() >= -(-int(flops) // self.unit))

    def add_memory_cuts(self, budget_bytes: int) -> int:
        """The knapsack rows added while time is left (:func:`~solvers.cpsat.cuts.add_knapsack_rows`); their bound."""
        return add_knapsack_rows(self, budget_bytes)

    def add_upper_bound(self, flops: int) -> None:
        """The recompute FLOPs are at most ``flops`` (a plan that fits is known)."""
        self.m.Add(self._flops() <= int(flops) // self.unit)

    def forbid(self, regions) -> None:
        """Exclude exactly this plan (a no-good cut)."""
        self.m.AddBoolOr(region_literals(self.x, self.y, regions))

    # ----------------------------------------------------------------- solve
    def solve(self, *, time_limit_s: float, workers: int, gap_limit: float = 0.0, work_limit: float | None = None,
              seed: int = 0) -> ModelResult:
        """Run CP-SAT and read the plan out.

        Args:
            time_limit_s: wall-clock limit (a safety net when ``work_limit`` is set), at most
                :meth:`search_left` (NOTE [ What follows a search ]); ``workers``: search workers.
            gap_limit: stop once ``(objective - bound) / objective`` is at most this (CP-SAT's
                ``relative_gap_limit``); the status stays ``feasible`` unless the bound meets the objective.
            work_limit: CP-SAT's ``max_deterministic_time``, the workers interleaved in one deterministic
                schedule (NOTE [ Deterministic CP-SAT ] in ``solvers.cpsat.solver``); None: the wall clock only.
            seed: CP-SAT's ``random_seed``.
        """
        time_limit_s = max(0.01, min(time_limit_s, self.search_left()))  # NOTE [ What follows a search ]
        solver = new_solver(time_limit_s=time_limit_s, workers=workers, gap_limit=gap_limit,
                            work_limit=work_limit, seed=seed)
        log.info("ilp: CP-SAT searching (%d nodes, %.0f s at most)", len(self.graph), time_limit_s)
        status = run_cp_sat(solver, self.m, Progress(self.unit), expired=self._stop_search)
        if status is None:  # NOTE [ CP-SAT past its time limit ]: left running, nothing read from it
            return ModelResult("unknown", None, float("nan"), float("nan"), time_limit_s, 0.0)
        name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                cp_model.INFEASIBLE: "infeasible"}.get(status, "unknown")
        log.info("ilp %s: status %s, objective %s, bound %s, %.2fs", self.graph.name, name,
                 solver.ObjectiveValue() if name in ("optimal", "feasible") else None,
                 solver.BestObjectiveBound(), solver.WallTime())
        if name == "optimal" and solver.BestObjectiveBound() < solver.ObjectiveValue() - 0.5:
            name = "feasible"  # stopped at the gap limit: not proven
        bound = solver.BestObjectiveBound() * self.unit
        work = float(solver.deterministic_time)
        if name not in ("optimal", "feasible"):
            return ModelResult(name, None, float("nan"), bound, solver.WallTime(), work)
        return ModelResult(name, self.read_regions(solver), solver.ObjectiveValue() * self.unit,
                           bound, solver.WallTime(), work)

    def read_regions(self, solver: cp_model.CpSolver) -> tuple[tuple[int, int], ...]:
        """The plan in ``solver``'s solution: a region per run of ``x`` cut where ``y`` starts one."""
        regions: list[list[int]] = []
        for k in range(len(self.graph)):
            if solver.Value(self.x[k]):
                if solver.Value(self.y[k]) or not regions:
                    regions.append([k, k])
                else:
                    regions[-1][1] = k
        return tuple((a, b) for a, b in regions)
