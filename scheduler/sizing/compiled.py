"""Our plan aimed at a peak measured under torch.compile: solve, compile, measure, solve again.

``scheduler.solve_compiled`` (``scheduler.compiled``) runs it for a user's model; ``benchmarks/compile.py`` for the compile page.

NOTE [ Compile-aware budget ]
    Our prediction (``simulate``) is eager's: what autograd saves, op by op.
    Inductor fuses, and its partitioner chooses what the compiled forward
    hands to the compiled backward, so the same plan measures another peak
    compiled: the unplanned steps of GPT-2 and Llama measured 0.66 of their
    prediction, ResNet-18's 1.27 (inductor's channels-last copies of the
    convolution weights). The ratio differs from plan to plan (a plan that
    recomputes much measures near its prediction, the unplanned step far
    from it), so no one factor turns a measured target into a budget.

    :class:`Search` searches the eager budget instead. Each plan it compiles
    is a point (budget, predicted, measured). The next budget lies strictly
    between the largest budget whose plan measured at or under the target
    and the least whose plan measured over it: where the line through those
    two points (predicted -> measured) reaches the target, or, with a point
    on one side only, the nearest point's prediction scaled by
    target/measured; the midpoint when that guess falls outside the bracket
    (bisection). A solve that returns a plan measured before narrows the
    bracket without a compile. Points are kept across the targets of one
    model: a plan measures the same whatever budget it was solved at, and
    :meth:`Search.pick` chooses each target's plan again once every target
    has been searched.

    Under our least feasible budget (``InfeasibleBudget``) the search solves
    at that floor: the least-peak plan of our solver is measured, never
    nothing, and the answer says so (``at_floor``); inductor often measures
    it under the target. It stops after ``compiles`` new compiles, ``solves``
    solves, a bracket narrower than ``tolerance`` of the target, or the floor's
    plan over the target; then each other solver's least-peak plan is measured
    once (ilp's and dp's least-peak plans differ, and inductor does not rank
    them as our prediction does), so is the floor at each head chunk count of
    a ``chunks=`` menu alone, where the head runs fused (NOTE [ Fused head ]
    in ``solvers.model.fused``) so is the floor with it unfused at each count
    alone (:func:`unfused_twin`: autograd's chunk loop, whose chunks a region
    can hold), and so is a coarse plan that no solver of ours chooses, every
    child of the model a region (ResNet-18: predicted 95.26 MiB, over the
    floor's 93.76, measured 116.17 against the floor plan's 119.19:
    inductor's channels-last copies are made inside the regions it
    recomputes).

    A ``chunks=`` menu with a count above 1 is searched twice: as given, and
    without chunks (:func:`best_fit` keeps the faster fit of the two; the
    searches share what they compiled). Inductor and a chunked head do not
    rank as in eager: a small Llama's least-peak plan, 8 regions and its head
    in 8 chunks, predicted 10.83 MiB, measured 15.98 compiled, where 4
    regions and no chunks, predicted 18.18, measured 12.61 (its unplanned
    step 17.15), and the chunked search alone never solves at a budget that
    gives such a plan.

    Before the first target, more plans are measured, whatever the
    brackets say (``candidates``). Plans solved on the graph with the
    recompute priced as inductor runs it (:func:`inductor_costs`): a call
    that is no GEMM, convolution, attention or lookup is fused into the
    backward's kernels, and recomputing it there costs little. On eager's
    costs ``ilp`` keeps such calls and recomputes matmuls; on inductor's it
    chooses regions that recompute norms and activations (a small Llama: 6
    regions at 13.99 MiB, 21.5 ms compiled, against compile@0.7's 14.31 MiB
    at 22.0 and its unplanned step's 17.15 MiB at 19.5). What inductor
    measures of them does not rise with the eager budget, so they are
    solved on a grid of budgets (:func:`sweep_plans`), the head whole. And
    the model's largest families of repeated module calls
    (:func:`module_families`: its blocks, their attention, their MLPs),
    each call a region. And what compile's partitioner itself saves at its
    middle budgets (:func:`kernel_plans`): the outermost module calls as
    regions, every GEMM, convolution, attention and lookup in them kept,
    then the same with the kept outputs that cost least to recompute per
    byte left out, a quarter and a half of their bytes. ResNet-18 at
    compile@0.3 keeps 15 of its 20 convolution outputs and recomputes the
    stem's 2 MiB: 116.43 MiB at 138 ms, where our searches' plans
    measured 116.17 at 164 (every child a region) and 119.19 at 146 (the
    floor, 4 regions): a plan rises to 26 MiB over its eager prediction
    there (channels-last copies), so the eager budget does not find it. The
    model one region, its convolutions kept less the cheapest half of their
    bytes, measured 116.18 MiB at 0.99 of compile@0.3's time; all of them
    kept, 119.43 (the stem's output held).

    The plan kept: of those measured at or under the target, the fastest
    compiled step where every one was timed (``measure`` returns the peak
    and the time; on eager's costs the least predicted recompute, at 0.7 of
    that Llama's compiled peak a plan of 4 regions, ran at 25.6 ms where its
    MLPs as regions, a plan no solve returned, ran at 22.8), else the least
    predicted recompute time (the largest budget on a tie); none fitting,
    the least measured peak (``reached`` False).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from graphs import FUSED_HEADS_META

log = logging.getLogger(__name__)

__all__ = ["Point", "Fit", "Search", "best_fit", "speed", "plan_key", "unfused_twin", "graph_of", "module_families",
           "family_plans", "sweep_plans", "inductor_costs", "outer_regions", "kernel_plans", "KERNEL_OPS",
           "KERNEL_DROPS", "FUSED_RECOMPUTE"]


def plan_key(plan: Any) -> tuple:
    """What makes two plans the same plan to compile (regions, kept calls, nesting, chunks, a fused head or not)."""
    fused = (getattr(plan, "graph_meta", None) or {}).get(FUSED_HEADS_META)
    return (tuple(plan.modules), tuple(plan.save_ops), tuple(plan.inner), tuple(plan.chunks),
            None if fused is None else tuple(fused))


def unfused_twin(graph: Any, chunks: Sequence[int] | None) -> Any:
    """``graph`` with its head unfused (no ``FUSED_HEADS_META`` layers: autograd's chunk loop, NOTE [ Fused
    head ] in ``solvers.model.fused``), where a ``chunks`` menu would run it fused (a count above 1); else None."""
    import dataclasses

    if not graph.meta.get(FUSED_HEADS_META) or not any(k > 1 for k in chunks or ()):
        return None
    return dataclasses.replace(graph, meta={**graph.meta, FUSED_HEADS_META: []})


def graph_of(plan: Any, graph: Any, twin: Any) -> Any:
    """The graph ``plan`` was solved on: ``twin`` (:func:`unfused_twin`) for a plan solved there, else ``graph``."""
    meta = getattr(plan, "graph_meta", None) or {}
    return twin if twin is not None and meta.get(FUSED_HEADS_META) == [] else graph


@dataclass(frozen=True)
class Point:
    """One plan solved at ``budget``: its eager prediction and its measured peak (bytes)."""

    budget: int
    predicted: int
    measured: int
    key: Hashable = None
    plan: Any = None
    cost: float = 0.0
    time_s: float | None = None

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


@dataclass
class Fit:
    """The plan kept for one target, and how it was found."""

    target: int
    point: Point | None = None
    reached: bool = False
    at_floor: bool = False
    label: str = ""
    floor: int | None = None
    solves: int = 0
    compiles: int = 0
    tries: list[Point] = field(default_factory=list)
    bound: Any = None  # the plan's compiled peak bound (NOTE [ Compiled peak bound ]), where read

    @property
    def plan(self) -> Any:
        """The plan kept (None: nothing was measured)."""
        return None if self.point is None else self.point.plan

    @property
    def measured(self) -> int | None:
        """Its compiled step's peak by the allocator (bytes)."""
        return None if self.point is None else self.point.measured

    @property
    def predicted(self) -> int | None:
        """Its eager prediction (``simulate``, bytes)."""
        return None if self.point is None else self.point.predicted


class Search:
    """The points of one model, shared by its targets (NOTE [ Compile-aware budget ]).

    Args:
        solve: the plan at an eager budget (bytes); raises ``solvers.errors.InfeasibleBudget`` under the floor.
        measure: the peak of a plan compiled (bytes), or ``(peak, step seconds)``: with the step timed, the plan
            kept for a target is the fastest measured (:meth:`pick`).
        predict: the plan's eager prediction (bytes).
        key: what makes two plans the same (so one is compiled once).
        cost: the plan's predicted recompute time (lower is faster).
        plain: the unplanned step's (predicted, measured), a point that no solve returns: it brackets from above.
        others: (label, plan) pairs: each returns another plan (another solver's least-peak plan: label
            "floor plan"), measured once when ``solve``'s floor plan is over a target (kept apart from the
            brackets: its budget is not ``solve``'s); the label names it in :attr:`Fit.label`.
        measured: the plans measured so far by key, shared with the searches of the same model's other menus
            (:func:`best_fit`): a plan one of them compiled is not compiled again.
        candidates: (label, plan) pairs measured once, at the first target, whatever the brackets say (the
            model's module families, :func:`family_plans`).
    """

    def __init__(self, solve: Callable[[int], Any], measure: Callable[[Any], int], predict: Callable[[Any], int],
                 key: Callable[[Any], Hashable], cost: Callable[[Any], float],
                 plain: tuple[int, int] | None = None, others: Sequence[tuple[str, Callable[[], Any]]] = (),
                 measured: dict[Hashable, Point] | None = None,
                 candidates: Sequence[tuple[str, Callable[[], Any]]] = ()) -> None:
        self._solve, self._measure, self._predict, self._key, self._cost = solve, measure, predict, key, cost
        self._others = list(others)
        self._candidates = list(candidates)
        self.points: list[Point] = []
        self.extra: list[Point] = []  # the other solvers' least-peak plans: kept apart from the brackets
        self.measured: dict[Hashable, Point] = {} if measured is None else measured  # shared: compiled once
        self.floor: int | None = None
        self.floor_tried = False
        self.floor_keys: set[Hashable] = set()
        self.labels: dict[Hashable, str] = {}
        if plain is not None:
            self.points.append(Point(budget=plain[0], predicted=plain[0], measured=plain[1], key="unplanned"))

    def _bracket(self, target: int) -> tuple[Point | None, Point | None]:
        fit = [p for p in self.points if p.measured <= target]
        over = [p for p in self.points if p.measured > target]
        lo = max(fit, key=lambda p: p.budget, default=None)
        hi = min(over, key=lambda p: p.budget, default=None)
        return lo, hi

    def _guess(self, target: int, lo: Point | None, hi: Point | None) -> int:
        if lo is not None and hi is not None and hi.measured != lo.measured:
            guess = lo.predicted + (target - lo.measured) * (hi.predicted - lo.predicted) / (hi.measured - lo.measured)
        else:
            near = lo if lo is not None else hi
            guess = near.predicted * target / near.measured if near is not None else target
        low = lo.budget if lo is not None else (self.floor or 0)
        if hi is not None and not low < guess < hi.budget:
            guess = (low + hi.budget) / 2
        elif hi is None and guess <= low:
            guess = low * target / lo.measured if lo is not None else low
        return max(int(guess), self.floor or 1)

    def _point(self, budget: int, plan: Any, fit: Fit, compiles: int) -> Point | None:
        key = self._key(plan)
        known = self.measured.get(key)
        if known is None:
            if fit.compiles >= compiles:
                return None
            fit.compiles += 1
            known = self._new(budget, plan, key)
        point = Point(budget, known.predicted, known.measured, key, known.plan, known.cost, known.time_s)
        self.points.append(point)
        fit.tries.append(point)
        return point

    def _new(self, budget: int, plan: Any, key: Hashable) -> Point:
        """``plan`` compiled and measured (its peak, and its step's time where ``measure`` times it)."""
        got = self._measure(plan)
        peak, took = (got if isinstance(got, tuple) else (got, None))
        point = Point(budget, self._predict(plan), int(peak), key, plan, self._cost(plan), took)
        self.measured[key] = point
        return point

    def fit(self, target: int, *, compiles: int = 3, solves: int = 6, tolerance: float = 0.005) -> Fit:
        """The plan for a measured peak at or under ``target`` bytes (NOTE [ Compile-aware budget ])."""
        from solvers.errors import InfeasibleBudget

        out = Fit(target=target, floor=self.floor)
        self._measure_all(self._candidates, out)  # beside the search's own allowance of compiles and solves
        compiles, solves = compiles + out.compiles, solves + out.solves
        while out.solves < solves:
            lo, hi = self._bracket(target)
            if lo is not None and hi is not None and hi.budget - lo.budget <= tolerance * target:
                break
            if hi is not None and self.floor is not None and hi.budget <= self.floor:
                self._other_floors(out)  # the floor's plan measured over the target: another solver's floor
                break
            budget = self._guess(target, lo, hi)
            if any(p.budget == budget for p in self.points):
                break
            out.solves += 1
            try:
                plan = self._solve(budget)
            except InfeasibleBudget as exc:
                self.floor = out.floor = exc.min_feasible_bytes
                if self.floor_tried:
                    break
                self.floor_tried = True
                out.solves += 1
                budget, plan = self.floor, self._solve(self.floor)
            if budget == self.floor:
                self.floor_tried = True
                self.floor_keys.add(self._key(plan))
            if self._point(budget, plan, out, compiles) is None:
                break
        return self.pick(out)

    def _other_floors(self, out: Fit) -> None:
        """Each other solver's least-peak plan, measured once per search (one compile each, when new)."""
        self._measure_all(self._others, out)

    def _measure_all(self, plans: list[tuple[str, Callable[[], Any]]], out: Fit) -> None:
        """Each labelled plan of ``plans`` (emptied), measured once (one compile each, when new), kept apart
        from the brackets: its budget is not ``solve``'s."""
        while plans:
            label, make = plans.pop(0)
            plan = make()
            if plan is None:
                continue
            key = self._key(plan)
            self.labels.setdefault(key, label)
            if label == "floor plan":
                self.floor_keys.add(key)
            known = self.measured.get(key)
            if known is not None:  # measured already, by this search or by a search it shares its plans with
                if not any(p.key == key for p in self.points + self.extra):
                    self.extra.append(known)
                continue
            out.solves, out.compiles = out.solves + 1, out.compiles + 1
            point = self._new(self.floor or 0, plan, key)
            self.extra.append(point)
            out.tries.append(point)

    def pick(self, out: Fit) -> Fit:
        """``out`` with the plan kept for its target among every point measured so far (a later target's
        search may have measured a better one): the fastest at or under the target (:func:`speed`), else the
        lowest."""
        target = out.target
        out.floor = self.floor
        mine = [p for p in self.points + self.extra if p.plan is not None]
        fits = [p for p in mine if p.measured <= target]
        if fits:
            out.point = min(fits, key=speed(fits))
        elif mine:
            out.point = min(mine, key=lambda p: (p.measured, p.cost))
        out.reached = bool(fits)
        out.at_floor = out.point is not None and out.point.key in self.floor_keys
        out.label = "" if out.point is None else ("floor plan" if out.at_floor else self.labels.get(out.point.key, ""))
        log.info("compile: target %.2f MiB -> %s after %d solves, %d compiles", target / 2**20,
                 "none" if out.point is None else f"{out.point.measured / 2**20:.2f} MiB measured "
                 f"({out.point.predicted / 2**20:.2f} predicted)", out.solves, out.compiles)
        return out


#: ATen calls that inductor runs as their own kernels (GEMMs, convolutions, attention, lookups): a recompute of
#: them costs what it costs in eager; every other call is fused into the backward's kernels
#: (:func:`inductor_costs`).
KERNEL_OPS = ("mm", "convolution", "scaled_dot_product", "embedding")
#: What a recompute of a fused call (pointwise, a reduction, a view) costs under inductor, as a fraction of eager's.
FUSED_RECOMPUTE = 0.05


def inductor_costs(graph: Any, fraction: float = FUSED_RECOMPUTE) -> Any:
    """``graph`` with the recompute of every node that runs none of :data:`KERNEL_OPS` priced at ``fraction`` of
    its cost: inductor fuses such calls into the backward's kernels, where a recompute rereads the inputs that
    the kernel reads anyway (NOTE [ Compile-aware budget ]; the same plans, the same fingerprint)."""
    import dataclasses

    def fused(nd: Any) -> bool:
        return not any(op in call for call in nd.dispatch for op in KERNEL_OPS)

    return graph.with_nodes([dataclasses.replace(nd, fwd_cost=int(nd.fwd_cost * fraction)) if fused(nd) else nd
                             for nd in graph.nodes])


#: What :func:`kernel_plans` leaves out of the kept kernels, as fractions of their output bytes (cheapest first).
KERNEL_DROPS = (0.0, 0.25, 0.5)


def outer_regions(graph: Any) -> list[tuple[int, int]]:
    """The outermost module calls a region can be (usable spans inside no other), left to right."""
    from solvers.model.spans import SpanIndex

    out: list[tuple[int, int]] = []
    for a, b in sorted(SpanIndex(graph).spans, key=lambda s: (s[0], -s[1])):
        if not out or a > out[-1][1]:
            out.append((a, b))
    return out


def kernel_plans(graph: Any, drops: Sequence[float] = KERNEL_DROPS) -> list[tuple[str, Callable[[], Any]]]:
    """``(label, plan)`` for :class:`Search`'s ``candidates``: :func:`outer_regions` as regions, keeping the output
    of every node there that runs one of :data:`KERNEL_OPS` (NOTE [ Compile-aware budget ]: what compile's
    partitioner saves), less, for each of ``drops``, the kept outputs that cost least to recompute per byte
    (``fwd_cost / out_bytes``) until that fraction of their bytes is left out. Nodes a selective policy cannot
    keep, or that a region's recompute never reaches (NOTE [ The menu of kept sets ]), are not kept."""
    from solvers import Plan
    from solvers.model.selective import recompute_reach

    regions = outer_regions(graph)
    if not regions:
        return []
    reach = recompute_reach(graph)
    nodes = graph.nodes
    kept = [i for a, b in regions for i in range(a, min(b, reach[b]) + 1)
            if nodes[i].sac_op >= 0 and nodes[i].out_bytes > 0
            and any(op in call for call in nodes[i].dispatch for op in KERNEL_OPS)]
    kept.sort(key=lambda i: (nodes[i].fwd_cost / nodes[i].out_bytes, i))
    total = sum(nodes[i].out_bytes for i in kept)

    def plan(fraction: float) -> Any:
        left, dropped = list(kept), 0
        while left and dropped < fraction * total:
            dropped += nodes[left.pop(0)].out_bytes
        return Plan.from_regions(graph, regions, saved=tuple(sorted(left)))

    return [("outermost calls, kernels kept" + (f" less the cheapest {f:.0%} of their bytes" if f else ""),
             lambda f=f: plan(f)) for f in dict.fromkeys(drops)]


def sweep_plans(solve: Callable[[Any, int], Any], graph: Any, top: int, count: int = 8
                ) -> list[tuple[str, Callable[[], Any]]]:
    """``(label, plan)`` for :class:`Search`'s ``candidates``: ``solve(graph, budget)`` at ``count`` eager budgets
    evenly from ``graph``'s least feasible one up to (not at) ``top`` bytes (``graph`` is :func:`inductor_costs`'
    in the compile-aware search: what inductor measures does not rise with the eager budget, so a grid, not a
    bisection)."""
    from solvers.errors import InfeasibleBudget

    floor: list[int] = []

    def at(i: int) -> Any:
        if not floor:
            try:
                solve(graph, 1)
                floor.append(1)
            except InfeasibleBudget as exc:
                floor.append(exc.min_feasible_bytes)
        return solve(graph, int(floor[0] + (top - floor[0]) * i / count))

    return [(f"inductor's costs, {i}/{count} up the budgets", lambda i=i: at(i)) for i in range(count)]


def module_families(graph: Any, limit: int = 3) -> list[tuple[str, list[tuple[int, int]]]]:
    """``(pattern, regions)`` for the ``limit`` families of repeated module calls of ``graph`` that cover the most
    nodes: module paths alike but for their numbers (``model.layers.*.mlp``, torchvision ResNet's
    ``layer*.*``), each call of the family a region (the recomputable ones, left to right without overlap; two at
    least), no two families with the same regions."""
    import re

    from solvers.model.spans import SpanIndex

    usable = set(SpanIndex(graph).spans)
    groups: dict[str, set[tuple[int, int]]] = {}
    for sp in graph.spans:
        pattern = re.sub(r"\d+", "*", sp.module or "")
        if pattern != (sp.module or "") and (sp.first, sp.last) in usable:
            groups.setdefault(pattern, set()).add((sp.first, sp.last))
    found: dict[tuple[tuple[int, int], ...], str] = {}
    for pattern, spans in sorted(groups.items()):
        regions: list[tuple[int, int]] = []
        for a, b in sorted(spans):
            if not regions or a > regions[-1][1]:
                regions.append((a, b))
        if len(regions) >= 2:
            found.setdefault(tuple(regions), pattern)
    ranked = sorted(found.items(), key=lambda kv: (-sum(b - a + 1 for a, b in kv[0]), kv[1]))
    return [(pattern, list(regions)) for regions, pattern in ranked[:limit]]


def family_plans(graph: Any, limit: int = 3) -> list[tuple[str, Callable[[], Any]]]:
    """``(label, plan)`` for :class:`Search`'s ``candidates``: each of :func:`module_families` as a plan, every
    call of the family a region (a small Llama's MLPs so measured 14.24 MiB compiled, at 22.8 ms, where
    compile's own budget at 0.7 measured 14.31 MiB at 23.1 and our solver's plan at that peak 25.6 ms)."""
    from solvers import Plan

    return [(f"each {pattern}", lambda regions=regions: Plan.from_regions(graph, regions))
            for pattern, regions in module_families(graph, limit)]


def speed(points: Sequence[Point]) -> Callable[[Point], tuple]:
    """The order of "faster" among ``points``: by the compiled step's measured time where every one of them was
    timed (the least predicted cost, then the largest budget, on a tie), else by the predicted cost alone."""
    if points and all(p.time_s is not None for p in points):
        return lambda p: (p.time_s, p.cost, -p.budget)
    return lambda p: (p.cost, -p.budget)


def best_fit(fits: Sequence[Fit]) -> Fit:
    """One target's fits from the searches of a model's menus (the head in chunks, and not: NOTE [ Compile-aware
    budget ]): the fastest (:func:`speed`) of those that reached it, else the lowest measured; its counts and
    tries are all of theirs."""
    import dataclasses

    found = [f for f in fits if f.point is not None]
    reached = [f for f in found if f.reached]
    if reached:
        fastest = speed([f.point for f in reached])
        best = min(reached, key=lambda f: fastest(f.point))
    elif found:
        best = min(found, key=lambda f: (f.point.measured, f.point.cost))
    else:
        best = fits[0]
    return dataclasses.replace(best, solves=sum(f.solves for f in fits), compiles=sum(f.compiles for f in fits),
                               tries=[p for f in fits for p in f.tries])

