"""Our best plan against one peer at the peer's own measured peak, timed side by side.

``ckpt compare`` measures every method against the un-checkpointed step, one
method at a time. This module answers the narrower question issue 15 asks:
at the memory per-block checkpointing (or ``torch.compile`` at an
``activation_memory_budget``) actually reaches, is our plan faster?

:func:`head_to_head`:

1. measures the peer's peak (profiler allocator events, the same meter for
   every method) and its gradients;
2. solves our plan with that peak as the budget, applies it, measures its
   peak, and solves again below the peak while ours measures above it
   (:func:`scheduler.comparing.choosing.solve_below`), so our memory is equal or
   lower;
3. times the un-checkpointed step, the peer and ours alternately in one
   window (:func:`alternate`: every round runs all three, in a rotating order),
   and takes medians: the ratio ours/peer and each method's measured extra
   time over the plain step;
4. predicts each method's extra time from the graph, with every cost model
   asked for (the roofline default and FLOPs): the recompute cost at the
   graph's rate (``Simulation.recompute_time_s``).

The peer is installed only around its own steps (NOTE [ A peer is on for its
own calls only ] in ``scheduler.comparing.peers``); our plan is switched on
per call by ``scheduler.applying.planned``.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch

import solvers
from graphs import Graph
from solvers import InfeasibleBudget, Plan, simulate

from . import peers
from ..measuring.profiler import profile_step
from ..measuring.steps import grad_difference, grad_snapshot
from .choosing import pick_key, plan_key, selective_options, solve_below
from .rows import Row
from .run import Workload, _Bench, block_plan, trace_graph

__all__ = ["alternate", "Side", "HeadToHead", "head_to_head", "predicted_extra"]

log = logging.getLogger(__name__)


def alternate(steps: Mapping[str, Callable[[], Any]], *, repeats: int, before_each: Callable[[], None] | None = None,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds of every step of ``steps``, run in rounds: each round runs each step once.

    The order rotates by one every round, so each method runs in each position
    as often as the others (what one step leaves behind, and drift, weigh on
    all alike). Returns every time, per name, in run order.
    """
    names = list(steps)
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(max(1, repeats)):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            if before_each is not None:
                before_each()
            t0 = clock()
            steps[name]()
            out[name].append(clock() - t0)
    return out


@dataclass(frozen=True)
class Side:
    """One method of the pair, measured.

    Attributes:
        method: ``per-block``, ``torch.compile@0.3``, ``dp``...
        peak_bytes: profiler peak of one step (whole step: parameters and inputs included).
        time_s: median step seconds (alternated with the other two).
        extra_s: ``time_s`` less the plain step's median from the same run.
        grad_max_abs_diff: largest |grad - plain step's grad| (0.0: bitwise equal).
        predicted_extra_s: per cost model (``roofline``, ``flops``), the predicted recompute
            time; None where the method does not map onto the graph (``torch.compile``).
        recompute_flops: predicted recomputed FLOPs (graph-mapped methods).
        budget_bytes: the budget our plan was solved at (ours).
        solves: how many solves it took to measure at or below the peer's peak (ours).
        selective: the plan kept nodes (selective recompute) and the applier lowered them (ours).
        note: what ran.
    """

    method: str
    peak_bytes: int
    time_s: float
    extra_s: float
    grad_max_abs_diff: float
    predicted_extra_s: Mapping[str, float | None] = field(default_factory=dict)
    recompute_flops: int | None = None
    budget_bytes: int | None = None
    solves: int = 0
    selective: bool = False
    note: str = ""


@dataclass(frozen=True)
class HeadToHead:
    """Ours against one peer on one model (JSON via :meth:`to_dict`)."""

    model: str
    peer: Side | None
    ours: Side | None
    plain_time_s: float | None
    repeats: int
    reason: str | None = None

    @property
    def ratio(self) -> float | None:
        """Median step time, ours over the peer's."""
        return self.ours.time_s / self.peer.time_s if self.ours and self.peer and self.peer.time_s else None

    def error(self, costs: str) -> float | None:
        """Summed |predicted - measured| extra seconds of both sides under ``costs``."""
        errs = []
        for side in (self.peer, self.ours):
            pred = side.predicted_extra_s.get(costs) if side else None
            if side is None or pred is None:
                continue
            errs.append(abs(pred - side.extra_s))
        return sum(errs) if errs else None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "peer": asdict(self.peer) if self.peer else None,
                "ours": asdict(self.ours) if self.ours else None, "plain_time_s": self.plain_time_s,
                "repeats": self.repeats, "ratio": self.ratio, "reason": self.reason}


def predicted_extra(graphs: Mapping[str, Graph], regions: Sequence[tuple[int, int]], saved: Sequence[int] = ()
                    ) -> tuple[dict[str, float | None], int | None]:
    """The predicted recompute seconds of ``regions`` (and kept nodes) on each cost model's graph.

    The graphs are traces of one model differing only in their costs, so a
    plan's regions mean the same nodes on each."""
    out: dict[str, float | None] = {}
    flops = None
    for name, g in graphs.items():
        plan = Plan.from_regions(g, regions, saved=tuple(saved)) if saved else Plan.from_regions(g, regions)
        sim = simulate(g, plan, record=False)
        out[name] = sim.recompute_time_s
        flops = sim.recompute_flops
    return out, flops


def head_to_head(wl: Workload, peer: str = "per-block", *, fraction: float | None = None, solver_names: Sequence[str] = ("dp",),
                 selective: bool | None = None, repeats: int = 7, warmup: int = 1, cost_models: Sequence[str] = ("roofline", "flops"),
                 solver_options: Mapping[str, Mapping[str, Any]] | None = None, graphs: Mapping[str, Graph] | None = None,
                 bench: _Bench | None = None, progress: Callable[[str], None] | None = None) -> HeadToHead:
    """Ours against ``peer`` (``per-block`` or ``torch.compile`` at ``fraction``) at the peer's measured peak.

    Args:
        wl: the model and input.
        peer: ``"per-block"`` or ``"torch.compile"`` (then ``fraction`` is its
            ``activation_memory_budget``).
        solver_names: our solvers; the plan with the lowest ``recompute_cost``
            (the solvers' objective, on the first cost model's graph) is ours.
        selective: let the solvers keep nodes (None: on, as ``scheduler.apply``
            lowers them to selective-checkpoint policies).
        repeats: alternated rounds (each runs plain, peer and ours once).
        cost_models: graphs to trace (``scheduler.trace``'s ``costs``); the
            first is what our solvers minimise, each predicts the extra time.
        graphs, bench: reuse traces and the plain step between calls on one model.
    """
    say = progress or (lambda s: log.info("%s", s))
    wl.model.train()
    graphs = dict(graphs) if graphs is not None else {c: trace_graph(wl, c) for c in cost_models}
    main = graphs[cost_models[0]]
    bench = bench or _Bench(wl, repeats=repeats, warmup=warmup)
    opts = selective_options(solver_names, solver_options or {}, selective)
    tag = peer if fraction is None else f"{peer}@{fraction:g}"

    def gradients(step: Callable[[], Any]) -> float:
        bench.clear()
        step()
        diff, _ = grad_difference(bench.params, bench.ref_grads)
        bench.clear()
        return diff

    def peak(step: Callable[[], Any]) -> int:
        bench.clear()
        p = profile_step(step, baseline_bytes=bench.baseline).peak_bytes
        bench.clear()
        return p

    if peer == "per-block":
        try:
            prepared = peers.per_block(wl.model)
        except peers.PeerUnavailable as exc:
            return HeadToHead(wl.name, None, None, None, repeats, reason=str(exc))
        regions_of_peer = block_plan(main, wl.model)
    elif peer == "torch.compile":
        prepared = peers.compiled(wl.model, fraction if fraction is not None else 1.0)
        regions_of_peer = None
    else:
        raise ValueError(f"peer {peer!r} is not per-block or torch.compile")

    peer_step = prepared.on(bench.step_of(prepared.forward, returns_loss=prepared.returns_loss))
    try:
        with prepared.scope():
            for _ in range(max(1, warmup)):
                bench.clear()
                peer_step()
            peer_diff = gradients(peer_step)
            peer_peak = peak(peer_step)
            say(f"{tag}: measured peak {peer_peak / 2**20:.1f} MiB")

            chosen: list[Plan] = []

            floors: dict[str, int] = {}
            solved: set[int] = set()

            def run(budget: int, row: Row) -> Row:
                plans = []
                for name in solver_names:
                    try:
                        plans.append(solvers.solve(main, budget, solver=name, **opts.get(name, {})))
                    except InfeasibleBudget as exc:
                        floors[name] = int(exc.min_feasible_bytes)
                if not plans and floors and budget < min(floors.values()) and min(floors.values()) not in solved:
                    # below our least predicted peak: the least plan, measured (the prediction may be over)
                    least = min(floors.values())
                    say(f"  infeasible at {budget / 2**20:.1f} MiB by the graph; our least plan "
                        f"({least / 2**20:.1f} MiB predicted) measured")
                    got = run(least, row)
                    return replace(got, note=f"{got.note}; our least plan, predicted {least / 2**20:.1f} MiB") \
                        if got.ran else got
                if not plans:
                    return replace(row, reason=f"infeasible at {budget / 2**20:.1f} MiB"
                                   + (" (our least plan measured above it)"
                                      if floors and min(floors.values()) in solved else ""))
                solved.add(budget)
                plan = min(plans, key=pick_key)
                chosen[:] = [plan]
                step = bench.step_of(_planned(wl.model, plan))
                bench.clear()
                step()  # warm
                got = peak(step)
                say(f"  {plan.solver} at {budget / 2**20:.1f} MiB: {len(plan.regions)} regions, "
                    f"measured {got / 2**20:.1f} MiB")
                return replace(row, method=plan.solver, measured_peak_bytes=got, note=plan.status)

            tries: list[int] = []
            # Where the graph predicts the peer's own plan above its measured peak (a few bytes of RNG
            # state or workspace rounding), start there: the measured peaks decide "at or below".
            start = peer_peak
            if regions_of_peer is not None:
                start = max(start, simulate(main, regions_of_peer, record=False).peak_bytes)
            row = solve_below(lambda b, r: (tries.append(b), run(b, r))[1], peer_peak, Row("ours", "ours"),
                              start=start)
            if not row.ran or row.measured_peak_bytes > peer_peak:
                return HeadToHead(wl.name, None, None, None, repeats,
                                  reason=row.reason or f"ours measured {row.measured_peak_bytes / 2**20:.1f} MiB, "
                                  f"above {tag}'s {peer_peak / 2**20:.1f} MiB after {len(tries)} solves")
            plan = chosen[0]
            ours_step = bench.step_of(_planned(wl.model, plan))
            ours_diff = gradients(ours_step)
            times = alternate({"plain": bench.reference, "peer": peer_step, "ours": ours_step}, repeats=repeats,
                              before_each=bench.clear)
    finally:
        prepared.undo()
        bench.clear()
    med = {k: statistics.median(v) for k, v in times.items()}
    if regions_of_peer is not None:
        peer_pred, peer_flops = predicted_extra(graphs, regions_of_peer.regions)
    else:
        peer_pred, peer_flops = {}, None
    ours_pred, ours_flops = predicted_extra(graphs, plan.regions, plan.saved)
    peer_side = Side(tag, peer_peak, med["peer"], med["peer"] - med["plain"], peer_diff, peer_pred, peer_flops,
                     note=prepared.note)
    ours_side = Side(plan.solver, row.measured_peak_bytes, med["ours"], med["ours"] - med["plain"], ours_diff, ours_pred,
                     ours_flops, budget_bytes=tries[-1], solves=len(tries), selective=bool(plan.saved),
                     note=f"{row.note}, {len(plan.regions)} regions" + (f", {len(plan.saved)} kept" if plan.saved else ""))
    out = HeadToHead(wl.name, peer_side, ours_side, med["plain"], repeats)
    say(f"{tag} vs {plan.solver}: time ours/{tag} {out.ratio:.3f}, peaks {peer_peak / 2**20:.1f} / "
        f"{row.measured_peak_bytes / 2**20:.1f} MiB, grad diffs {peer_diff:g} / {ours_diff:g}")
    return out


def _planned(model: torch.nn.Module, plan: Plan) -> Any:
    from ..applying import planned

    return planned(model, plan)
