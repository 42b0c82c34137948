"""Kept nodes in the CP-SAT model: ``cp-sat`` and ``ilp`` with ``selective=True`` on any graph.

NOTE [ Kept nodes in the CP-SAT model ]
    A selective plan is a set of ``(region, menu entry)`` pairs (NOTE [ The
    menu of kept sets ] in ``solvers.model.selective``). A region's menu depends on
    both its ends (the ranking is restricted to ``first..recompute_reach[last]``
    and its prefix lengths to how many nodes that holds), so it is no
    property of a node: :class:`KeptModel` adds one bool ``w`` per allowed
    ``(first, last, entry)`` with a non-empty entry. ``w`` implies the region
    is exactly ``first..last`` (``y[first]``, ``cont`` inside, no ``cont``
    after it), at most one ``w`` starts at a node, and a node is kept,
    ``kp[k]``, when a chosen ``w``'s entry holds it. The objective drops the
    cost of kept nodes, exactly.

    The memory rows are a *relaxation* of ``simulate`` for kept nodes, closed
    by a cutting loop (:func:`solve_selective`): every plan that fits
    satisfies the rows, a plan the model returns is simulated, and one that
    does not fit is cut off (a no-good over its regions and entries) before
    solving again. So the answer is exact when the loop ends with CP-SAT's
    ``optimal``: cuts remove only plans that do not fit. Against the rows of
    the plan without kept nodes, a kept node ``k`` of region ``a..b``:

    * adds its own buffers to every forward row after ``k``, and its output
      after its last forward reader where nothing else holds it
      (``g[k] >= kp[k] - held[k]``): exact;
    * adds both to every recompute and backward row after ``b`` (its cache is
      held until ``a..b``'s recompute reaches ``k``): exact for the buffers;
      the output past its last forward reader where nothing else holds it,
      and before it where the base model's forward-alive literal of ``k`` at
      that row is false (``h >= [k kept, region ended] - fa``): exact;
    * adds both (the output unless a sink, which the caller holds anyway)
      to ``a..b``'s own recompute rows before ``k``: exact;
    * its recompute row drops ``k``'s workspace (nothing runs); a kept sink's
      output comes off the rows where the plan without kept nodes holds two
      copies of it (its recomputed copy is the caller's storage, counted
      once): ``a..b``'s recompute rows from ``k`` on, and its backward rows
      from its first saver (in ``a..b``) on, where the rows count that copy.

    The first three only add what the plan really holds; the last only takes
    off what it may not hold. So no plan that fits is excluded; on the 210
    small graphs of ``tests/solvers/test_selective_exact.py`` the loop cut
    17 plans of the first 62 while the relief ran over the rows before the
    saver, and none since it runs from the first saver on, the rows that
    count the copy (880 budgets, 28 s in all with warm start off); it stays
    the guarantee. Each
    ``(first, last, entry)`` is a variable, so the model is used only up to
    :data:`MAX_CHOICES` of them; above, ``ilp`` and ``cp-sat`` keep their
    plan without kept nodes (``findings`` say so). The loop stops after
    :data:`MAX_CUTS` cuts or at the deadline with the best plan known to fit.
"""

from __future__ import annotations

import gc
import logging
from typing import Any, NamedTuple

from graphs import Graph

from ..deadline import Deadline, OutOfTime
from .solver import IlpTimeout
from .cuts import region_literals
from .model import CheckpointModel
from ..model.plan import Plan, Status
from ..model.selective import DEFAULT_LIMIT, GrowingMenus
from ..model.simulate import simulate
from ..warm import Incumbent, warm_starts

__all__ = ["MAX_CHOICES", "menu_choices", "KeptModel", "solve_selective"]

log = logging.getLogger(__name__)

#: The most ``(first, last, entry)`` variables the model takes (NOTE [ Kept nodes in the CP-SAT model ]).
MAX_CHOICES = 20_000
#: The most plans the cutting loop cuts off before it returns the best plan that fits, as ``feasible``.
MAX_CUTS = 2_000

Choice = tuple[int, int, tuple[int, ...]]


def menu_choices(graph: Graph, *, limit: int = DEFAULT_LIMIT) -> list[Choice] | None:
    """Every allowed region's non-empty menu entries as ``(first, last, entry)``, in order;
    None when there are more than :data:`MAX_CHOICES`."""
    n, ok, allowed = len(graph), [nd.recomputable for nd in graph.nodes], graph.allowed_regions()
    menus = GrowingMenus(graph, limit=limit)
    out: list[Choice] = []
    for a in range(n):
        b = a
        while b < n and ok[b]:
            if allowed is None or (a, b) in allowed:
                out.extend((a, b, e) for e in menus.of(a, b)[1:])
                if len(out) > MAX_CHOICES:
                    return None
            b += 1
    return out


class KeptModel(CheckpointModel):
    """:class:`~solvers.cpsat.model.CheckpointModel` with kept nodes (NOTE [ Kept nodes in the CP-SAT model ]).

    Args:
        graph: the cost graph.
        budget_bytes: whole-step budget.
        choices: :func:`menu_choices` of the graph.
    """

    def __init__(self, graph: Graph, *, budget_bytes: int, choices: list[Choice],
                 deadline: Deadline | None = None) -> None:
        self.choices = choices
        self._rows: tuple | None = None
        self._fa: dict[tuple[int, int], Any] = {}  # the base model's forward-alive literals
        self._ahead: dict[int, Any] = {}
        self._ended: list[list[int]] = [[] for _ in graph.nodes]  # the choices keeping j
        for i, (_, _, entry) in enumerate(choices):
            for j in entry:
                self._ended[j].append(i)
        self.saved: tuple[int, ...] = ()
        super().__init__(graph, budget_bytes=budget_bytes, deadline=deadline)

    def _variables(self) -> None:
        super()._variables()
        m, n = self.m, len(self.graph)
        self.w = []
        holding: list[list] = [[] for _ in range(n)]
        starting: list[list] = [[] for _ in range(n)]
        for i, (a, b, entry) in enumerate(self.choices):
            v = m.NewBoolVar(f"w{a}_{b}_{i}")
            m.AddImplication(v, self.y[a])  # the region is exactly a..b
            for k in range(a + 1, b + 1):
                m.AddImplication(v, self.cont[k])
            if b + 1 < n:
                m.AddImplication(v, self.cont[b + 1].Not())
            starting[a].append(v)
            for k in entry:
                holding[k].append(v)
            self.w.append(v)
        for group in starting:
            if len(group) > 1:
                m.AddAtMostOne(group)
        self.kp = [sum(h) if h else 0 for h in holding]
        self._keepable = [bool(h) for h in holding]

    def _flops(self):
        costs = self.graph.recompute_costs()
        return super()._flops() - sum((costs[k] // self.unit) * self.kp[k] for k in range(len(self.graph))
                                      if self._keepable[k])

    def _build_rows(self) -> tuple:
        """Running sums: ``fw[t]`` (kept bytes held at forward rows after t) and ``bw[t]``
        (cache bytes of regions ending before t), and the kept sinks' relief."""
        g, m, n, hi = self.graph, self.m, len(self.graph), self._hi
        out, lc, held = self._out, self._terms.last_reader, self._held_after
        sv = [nd.saved_bytes for nd in g.nodes]
        sink = self._terms.sinks
        fw_in: list[list] = [[] for _ in range(n)]
        bw_in: list[list] = [[] for _ in range(n + 1)]
        for k in range(n):
            if not self._keepable[k]:
                continue
            if sv[k]:
                fw_in[k].append(sv[k] * self.kp[k])
            if lc[k] >= 0 and out[k]:
                gk = m.NewBoolVar(f"kg{k}")
                m.Add(gk >= self.kp[k] - held[k])
                fw_in[max(k, lc[k])].append(out[k] * gk)
        for i, (a, b, entry) in enumerate(self.choices):
            w = self.w[i]
            if sum(sv[k] for k in entry):
                bw_in[b + 1].append(sum(sv[k] for k in entry) * w)
            for k in entry:
                if lc[k] >= 0 and out[k]:
                    gw = m.NewBoolVar(f"kw{i}_{k}")
                    m.Add(gw >= w - held[k])
                    bw_in[max(b + 1, lc[k])].append(out[k] * gw)
        relief: list[list] = [[] for _ in range(n)]  # rows of a region keeping a sink: counted once
        rc_in: list[list] = [[] for _ in range(n)]  # caches of the same region, later in it: recompute rows
        for i, (a, b, entry) in enumerate(self.choices):
            for t in range(a, max(entry)):
                held_here = sum(out[k] * (not sink[k]) + sv[k] for k in entry if k > t)
                if held_here:
                    rc_in[t].append(held_here * self.w[i])
            for k in entry:  # a kept sink's recomputed copy is the caller's: counted once while it lives
                if sink[k] and out[k]:
                    fs = self._terms.first_saver[k]  # the rows count that copy from its first saver (in a..b) on
                    for t in range(a, b + 1):
                        relief[t].append((out[k] * self.w[i], t >= k, fs <= t))
        self._rc_in = rc_in
        fw, bw = [], []
        for t in range(n):
            v = m.NewIntVar(0, hi, f"kf{t}")
            m.Add(v == (fw[-1] if fw else 0) + sum(fw_in[t]))
            fw.append(v)
            v = m.NewIntVar(0, hi, f"kb{t}")
            m.Add(v == (bw[-1] if bw else 0) + sum(bw_in[t]))
            bw.append(v)
        rec_relief = [sum(e for e, in_rc, _ in r if in_rc) for r in relief]
        bw_relief = [sum(e for e, _, in_bw in r if in_bw) for r in relief]
        return fw, bw, (rec_relief, bw_relief)

    def _forward_alive(self, j: int, k: int):
        f = self._fa[j, k] = super()._forward_alive(j, k)
        return f

    def _reader_ahead(self, t: int):
        """Output bytes of kept nodes cached at row t while a forward reader after t is to come:
        ``out[j]`` when j is kept in a region ending before t and its forward copy is not alive anyway."""
        terms = []
        for j in range(t):
            if self._ended[j] and self._terms.last_reader[j] > t and self._out[j] and (j, t) in self._fa:
                ended = sum(self.w[i] for i in self._ended[j] if self.choices[i][1] < t)
                if isinstance(ended, int):
                    continue
                h = self.m.NewBoolVar(f"ka{j}_{t}")
                self.m.Add(h >= ended - self._fa[j, t])
                terms.append(self._out[j] * h)
        return sum(terms)

    def _extra(self, k: int, phase: int):
        if self._rows is None:
            self._rows = self._build_rows()
        fw, bw, relief = self._rows
        if phase == 0:
            return fw[k - 1] if k else 0
        if k not in self._ahead:
            self._ahead[k] = self._reader_ahead(k)
        if phase == 2:
            return bw[k] - relief[1][k] + self._ahead[k]
        ws = self.graph.nodes[k].workspace_bytes if self._keepable[k] else 0
        return bw[k] - relief[0][k] - (ws * self.kp[k] if ws else 0) + sum(self._rc_in[k]) + self._ahead[k]

    def read_regions(self, solver: Any) -> tuple[tuple[int, int], ...]:
        """The regions (as the base model), and the kept nodes into :attr:`saved`."""
        self.saved = tuple(sorted(k for i, (_, _, e) in enumerate(self.choices) if solver.Value(self.w[i]) for k in e))
        return super().read_regions(solver)

    def _plan_literals(self, regions, saved) -> list:
        """Literals that are all false exactly on the plan ``(regions, saved)``."""
        lits = region_literals(self.x, self.y, regions)
        chosen, kept = set(regions), set(saved)
        for i, (a, b, e) in enumerate(self.choices):
            if (a, b) in chosen:
                lits.append(self.w[i].Not() if set(e) == {k for k in kept if a <= k <= b} else self.w[i])
        return lits

    def forbid_plan(self, regions, saved) -> None:
        """Exclude exactly the plan ``(regions, saved)`` (a no-good cut)."""
        self.m.AddBoolOr(self._plan_literals(regions, saved))

    def hint_plan(self, regions, saved) -> None:
        """Hint the region and choice variables with a plan."""
        self.add_hint(regions)
        chosen, kept = set(regions), set(saved)
        for i, (a, b, e) in enumerate(self.choices):
            self.m.AddHint(self.w[i], (a, b) in chosen and set(e) == {k for k in kept if a <= k <= b})


class _Inc(NamedTuple):
    regions: tuple[tuple[int, int], ...]
    saved: tuple[int, ...]
    cost: int
    source: str


def _incumbent(graph: Graph, budget_bytes: int, deadline: Deadline, work_limit: float | None) -> _Inc | None:
    """The cheapest fitting plan of the fast solvers, ``dp`` with kept nodes among them (NOTE [ Bounded warm
    starts ] in ``solvers.warm``)."""
    best = warm_starts(graph, budget_bytes, deadline, work_limit=work_limit, selective=True).best
    return None if best is None else _Inc(best.regions, best.saved, best.flops, best.source)


def solve_selective(graph: Graph, budget_bytes: int, deadline: Deadline, *, work_limit: float | None,
                    workers: int = 2, seed: int = 0, gap_limit: float = 0.0, warm_start_: bool = True,
                    choices: list[Choice] | None = None, incumbent: Incumbent | None = None) -> Plan | None:
    """The cheapest plan over ``(region, menu entry)`` pairs that fits (NOTE [ Kept nodes in the CP-SAT model ]).

    ``incumbent``: a plan known to fit (it may keep nodes); the warm starts run only without one.

    Returns:
        ``optimal`` (CP-SAT proved it with every cut made), or ``feasible`` with ``bound``;
        None when the graph has more than :data:`MAX_CHOICES` choices (the caller falls back).

    Raises:
        InfeasibleBudget: no plan fits (raised by the plain model, which the relaxation contains).
        IlpTimeout: no plan found within the deadline.
    """
    choices = menu_choices(graph) if choices is None else choices
    if choices is None:
        return None
    if incumbent is not None:
        inc = _Inc(incumbent.regions, incumbent.saved, incumbent.flops, incumbent.source)
    else:
        inc = _incumbent(graph, budget_bytes, deadline, work_limit) if warm_start_ else None
    findings: dict[str, Any] = {"method": "cp-sat (kept nodes)", "cuts": 0}

    def from_inc(status: str, bound: float | None) -> Plan:
        findings["incumbent"] = inc.source
        return Plan(regions=inc.regions, saved=inc.saved, status=status, bound=bound, findings=findings)

    if inc is not None and inc.cost == 0:
        return from_inc(Status.OPTIMAL, 0.0)
    try:
        model = KeptModel(graph, budget_bytes=budget_bytes, choices=choices, deadline=deadline)
    except OutOfTime as exc:
        log.info("ilp (kept nodes): %s", exc)
        gc.collect()  # the half-built model's cycles, freed within the limit (NOTE [ One deadline ])
        findings["cp_sat_stopped_by"] = "time limit"
        if inc is not None:
            return from_inc(Status.FEASIBLE, None)
        raise IlpTimeout(f"no plan found within {deadline.limit_s:.3g} s for this graph ({len(graph)} nodes; not "
                         "proven infeasible); raise time_limit_s (--time-limit)") from None
    if inc is not None:
        model.add_upper_bound(inc.cost)
        model.hint_plan(inc.regions, inc.saved)
    bound = None
    while findings["cuts"] < MAX_CUTS:
        left = model.search_left()  # NOTE [ What follows a search ] in solvers.cpsat.model
        if left <= 0:
            break
        result = model.solve(time_limit_s=left, workers=workers, gap_limit=gap_limit, work_limit=work_limit,
                             seed=seed)
        findings["cp_sat_status"] = result.status
        if result.status == "infeasible":
            if inc is not None:  # the incumbent fits, so it satisfies the relaxation: a model bug
                log.error("ilp (kept nodes): the model rejects the %s plan that simulate says fits", inc.source)
                return from_inc(Status.FEASIBLE, None)
            from .solver import solve_within  # the plain model: its plans are this model's with nothing kept
            return solve_within(graph, budget_bytes, deadline, work_limit=work_limit, workers=workers, seed=seed,
                                warm_start_=False)
        if result.regions is None:
            bound = max(0.0, result.bound) if result.bound == result.bound else None  # costs are >= 0
            break
        regions, saved = result.regions, model.saved
        sim = simulate(graph, Plan(regions=regions, saved=saved), record=False)
        if sim.peak_bytes <= budget_bytes:
            optimal = result.status == "optimal"
            bound = float(sim.recompute_cost) if optimal else max(0.0, float(result.bound))
            if inc is not None and inc.cost <= sim.recompute_cost:
                return from_inc(Status.OPTIMAL if optimal else Status.FEASIBLE, min(bound, float(inc.cost)))
            return Plan(regions=regions, saved=saved, status=Status.OPTIMAL if optimal else Status.FEASIBLE,
                        bound=bound, findings=findings)
        model.forbid_plan(regions, saved)
        findings["cuts"] += 1
    if inc is not None:
        return from_inc(Status.FEASIBLE, bound)
    raise IlpTimeout(f"no plan found within {deadline.limit_s:.3g} s for this graph ({len(graph)} nodes, kept "
                     "nodes searched); raise time_limit_s (--time-limit)"  # dp ran first when warm-starting
                     + ("" if warm_start_ else ", or use solver 'dp'"))

