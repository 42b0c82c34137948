"""``ckpt compare``: our solvers and the tools people use today, measured side by side.

``compare(workload, [0.2, 0.3, 0.5, 0.7])`` traces the model once, then for
each of our solvers at each budget fraction solves, applies and measures the
plan, and measures the peers (``scheduler.comparing.peers``: no checkpointing,
per-block checkpointing, ``checkpoint_sequential``, ``torch.compile`` with
``activation_memory_budget`` at the same fractions) in the same process, on
the same input and seed. Every method is measured the same way (NOTE
[ Measuring with profiler events ] in ``scheduler.measuring.profiler``): peak bytes and
the memory timeline from the profiler's allocator events, the step time as a
ratio of medians against the un-checkpointed step run alternately with it,
recomputed kernel FLOPs, and the largest gradient difference from the
un-checkpointed step. A method that cannot run gets a row with the reason.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import solvers
from graphs import CkptError, Graph
from solvers import InfeasibleBudget, Plan, simulate

from . import peers
from ..measuring.profiler import profile_step
from ..applying.selective import count_step_flops
from ..measuring.steps import grad_difference, grad_snapshot, measure_step_peak, time_steps
from ..measuring.training import clear_grads, seeded_step, step_tensors
from ..measuring.storages import live_bytes_of
from ..report import status_text
from ..sizing.memory import parse_budget
from .choosing import pick_key, plan_key, selective_options, solve_below
from .rows import Row
from .tables import format_table, machine, progress_line, timeline

__all__ = ["Workload", "Comparison", "compare", "format_table", "DEFAULT_FRACTIONS", "OUR_SOLVERS"]

log = logging.getLogger(__name__)

DEFAULT_FRACTIONS = (0.2, 0.3, 0.5, 0.7)
#: Our solvers compared by default, when registered (store-all is the "none" peer).
OUR_SOLVERS = ("chen-sqrt", "chen-greedy", "dp", "ilp")


@dataclass(frozen=True)
class Workload:
    """A model and one training step's input.

    Attributes:
        name: label for tables and files.
        model: the module, in train mode.
        args, kwargs: the step's inputs.
        loss: ``loss(outputs) -> scalar``; None: mean of the floating outputs.
        trace_loss: what the tracer is told about the loss (so that the
            applied plan's fingerprint matches); None: the tracer's default.
        meta: sizes for the record (batch, seq, ...).
    """

    name: str
    model: nn.Module
    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    loss: Callable[[Any], torch.Tensor] | None = None
    trace_loss: Any = None
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    """Everything :func:`compare` measured (JSON via :meth:`to_dict`)."""

    model: str
    meta: Mapping[str, Any]
    fractions: tuple[float, ...]
    rows: tuple[Row, ...]
    graph_nodes: int
    step_flops: int
    timelines: Mapping[str, Mapping[str, Any]]
    claims: tuple[Mapping[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "meta": dict(self.meta), "fractions": list(self.fractions),
                "graph_nodes": self.graph_nodes, "step_flops": self.step_flops,
                "rows": [asdict(r) for r in self.rows], "claims": [dict(c) for c in self.claims],
                "timelines": {k: dict(v) for k, v in self.timelines.items()}}


class _Bench:
    """The shared measuring harness: one model, one input, one seed, one reference step."""

    def __init__(self, wl: Workload, *, repeats: int, warmup: int, seed: int = 0) -> None:
        self.wl, self.repeats, self.warmup, self.seed = wl, repeats, warmup, seed
        self.loss = wl.loss or default_loss
        self.params = [p for p in wl.model.parameters() if p.requires_grad]
        self.baseline = live_bytes_of(step_tensors(wl.model, wl.args, wl.kwargs))
        self.reference = self.step_of(wl.model)
        self.ref_times: list[float] = []
        for _ in range(max(1, warmup)):
            self.clear()
            self.reference()
        self.clear()
        self.reference()
        self.ref_grads = grad_snapshot(self.params)
        self.clear()
        with FlopCounterMode(display=False) as fc:
            self.reference()
        self.step_flops = int(fc.get_total_flops())
        self.clear()
        self.ref_trace = profile_step(self.reference, baseline_bytes=self.baseline)

    def clear(self) -> None:
        clear_grads(self.params)

    def step_of(self, forward: Callable[..., Any], *, returns_loss: bool = False) -> Callable[[], Any]:
        return seeded_step(forward, self.wl.args, self.wl.kwargs, None if returns_loss else self.loss, seed=self.seed)

    def meter(self, forward: Callable[..., Any], *, returns_loss: bool = False) -> int | None:
        """Peak of one step by ``scheduler.measuring.storages`` (blind to compiled code: eager only)."""
        self.clear()
        torch.manual_seed(self.seed)
        peak = measure_step_peak(forward, self.wl.model, self.wl.args, self.wl.kwargs, None if returns_loss else self.loss)
        self.clear()
        return peak

    def measure(self, prepared: peers.Prepared, row: Row, *, eager: bool = True) -> tuple[Row, Any]:
        """Warm up, then gradients, profiled peak and interleaved time of ``prepared``."""
        # on for its own calls only (NOTE [ A peer is on for its own calls only ] in peers)
        step = prepared.on(self.step_of(prepared.forward, returns_loss=prepared.returns_loss))
        try:
            with prepared.scope():
                for _ in range(self.warmup):
                    self.clear()
                    step()
                self.clear()
                step()
                diff, rel = grad_difference(self.params, self.ref_grads)
                self.clear()
                tr = profile_step(step, baseline_bytes=self.baseline)
                t_m, t_r = time_steps(step, self.reference, repeats=self.repeats, before_each=self.clear)
                metered = prepared.on(lambda: self.meter(prepared.forward, returns_loss=prepared.returns_loss))() \
                    if eager else None
                counted = None
                if eager:  # NOTE [ Counting what a selective policy served ]
                    self.clear()
                    torch.manual_seed(self.seed)
                    counted = count_step_flops(step)
        finally:
            prepared.undo()
            self.clear()
        self.ref_times.append(t_r)
        if counted is not None:
            extra = max(0, counted[0] - self.step_flops)
            served = counted[1]["served_calls"]
        else:
            extra, served = max(0, tr.kernel_flops - self.ref_trace.kernel_flops), None
        row = replace(row, measured_peak_bytes=tr.peak_bytes, meter_peak_bytes=metered, step_time_ratio=t_m / t_r, step_time_s=t_m,
                      measured_extra_s=t_m - t_r, served_calls=served,
                      measured_recompute_ratio=extra / self.step_flops if self.step_flops else None,
                      grad_max_abs_diff=diff, grad_rel_diff=rel, note=row.note or prepared.note)
        return row, tr


def default_loss(out: Any) -> torch.Tensor:
    """The output itself when it is a scalar (built-in models return their loss), its ``.loss``
    (transformers), else the sum of the means of its floating tensors."""
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        return out.reshape(())
    if getattr(out, "loss", None) is not None:
        return out.loss
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise CkptError("the model returns no floating tensor to take a loss of; give the workload a loss")
    return sum(t.float().mean() for t in leaves)  # type: ignore[return-value]


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def trace_graph(wl: Workload, costs: str = "roofline", workspaces: str = "auto") -> Graph:
    """The workload's cost graph (``scheduler.trace``), leaving buffers and RNG as they were.

    ``workspaces="none"`` for comparisons with the storage count (``scheduler.measuring.storages``),
    which does not see op workspaces (NOTE [ Op workspaces ])."""
    model = wl.model
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers]
    try:
        with torch.random.fork_rng():
            from .. import applying  # noqa: F401  (NOTE [ Recompute timed in the step ])
            from ..tracing.tracer import capture

            return capture(model, wl.args, dict(wl.kwargs), loss=wl.trace_loss, costs=costs,
                           workspaces=workspaces).graph
    finally:
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)


def block_plan(graph: Graph, model: nn.Module) -> Plan | None:
    """Our graph's regions for per-block checkpointing (None if blocks do not map to intervals)."""
    regions = []
    for name, _ in peers.find_blocks(model):
        idx = [i for i, n in enumerate(graph.nodes) if n.module == name or n.module.startswith(name + ".")]
        if not idx:
            return None
        regions.append((min(idx), max(idx)))
    try:
        return Plan.from_regions(graph, regions) if regions else None
    except CkptError:
        return None


def compare(wl: Workload, fractions: Sequence[float] = DEFAULT_FRACTIONS, *, solver_names: Sequence[str] | None = None,
            with_peers: bool = True, match_peers: bool = True, repeats: int = 5, warmup: int = 1,
            solver_options: Mapping[str, Mapping[str, Any]] | None = None,
            progress: Callable[[str], None] | None = None, costs: str = "roofline") -> Comparison:
    """Measure our solvers and the peers on one workload.

    Args:
        wl: model and input.
        fractions: budgets, as fractions of the store-all activation peak.
        solver_names: our solvers; default those of :data:`OUR_SOLVERS` registered.
        with_peers: also measure the peers (``none`` is always measured).
        match_peers: also run our best solver with each peer's measured peak
            as its budget (the head-to-head at equal memory).
        repeats: timed steps per method (median), alternated with the reference.
        warmup: untimed steps per method first (compiles ``torch.compile``).
        solver_options: per-solver options (``{"ilp": {"time_limit_s": 20}}``).
        progress: called with a line per method measured.
        costs: what our solvers minimise (``scheduler.trace``'s ``costs``):
            ``"roofline"`` (the default; the solvers' default objective),
            ``"time"``, each node's measured forward time (NOTE [ Time
            costs ]), or ``"flops"``. The best of several plans is the one
            with the lowest ``recompute_cost`` (:func:`pick_key`).

    Returns:
        A :class:`Comparison`.
    """
    run = _Comparison(wl, fractions, solver_names, repeats, warmup, solver_options, progress, costs)
    run.reference()
    if with_peers:
        run.peers()
    run.ours_at_fractions()
    if match_peers:
        run.ours_at_peers()
    return run.result()


class _Comparison:
    """One :func:`compare` run, in its phases: the plain step, the peers, our plans at each fraction,
    our plans at each peer's measured peak, the result with its claims."""

    def __init__(self, wl: Workload, fractions: Sequence[float], solver_names: Sequence[str] | None, repeats: int,
                 warmup: int, solver_options: Mapping[str, Mapping[str, Any]] | None,
                 progress: Callable[[str], None] | None, costs: str) -> None:
        self.wl, self.repeats, self.costs = wl, repeats, costs
        self.say = progress or (lambda s: log.info("%s", s))
        self.fractions = tuple(float(f) for f in fractions)
        self.names = list(solver_names) if solver_names is not None else [
            s for s in OUR_SOLVERS if s in solvers.available_solvers()]
        self.opts = selective_options(list(self.names) + ["dp", "ilp"], solver_options or {})
        wl.model.train()
        self.graph = trace_graph(wl, costs)
        self.bench = _Bench(wl, repeats=repeats, warmup=warmup)
        self.sim_all = simulate(self.graph)
        self.has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in wl.model.modules())
        self.rows: list[Row] = []
        self.timelines: dict[str, Any] = {"none": timeline(self.sim_all, self.bench.ref_trace, self.graph)}
        self.measured: dict[tuple, tuple[str, Row, Any]] = {}  # plan_key -> (label, row, trace)
        self.best_trace: list[Any] = []  # [budget, label, plan, trace] of the lowest fraction measured

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.say(progress_line(row))

    def reference(self) -> None:
        """The plain autograd step: the row every ratio is against."""
        bench = self.bench
        row = Row("none", "peer", predicted_peak_bytes=self.sim_all.peak_bytes,
                  measured_peak_bytes=bench.ref_trace.peak_bytes, meter_peak_bytes=bench.meter(self.wl.model),
                  step_time_ratio=1.0, recompute_ratio=0.0, measured_recompute_ratio=0.0, grad_max_abs_diff=0.0,
                  grad_rel_diff=0.0, regions=0, note="plain autograd step")
        self.rows.append(row)
        self.say(f"none: measured peak {row.measured_peak_bytes / 2**20:.1f} MiB")

    def peers(self) -> None:
        """Per-block, checkpoint_sequential and torch.compile at every fraction (and 1.0)."""
        model = self.wl.model
        self._peer(Row("per-block", "peer"), lambda: peers.per_block(model), block_plan(self.graph, model))
        self._peer(Row("checkpoint_sequential", "peer"), lambda: peers.sequential(model))
        for f in sorted(set(self.fractions) | {1.0}):
            self._peer(Row("torch.compile", "peer", budget=f), lambda f=f: peers.compiled(model, f))

    def _peer(self, row: Row, make: Callable[[], peers.Prepared], predicted: Plan | None = None) -> None:
        try:
            prepared = make()
            if predicted is not None:
                sim = simulate(self.graph, predicted, record=False)
                row = replace(row, predicted_peak_bytes=sim.peak_bytes, recompute_ratio=sim.recompute_ratio,
                              recompute_flops=sim.recompute_flops, recompute_cost=sim.recompute_cost,
                              predicted_extra_s=sim.recompute_time_s, regions=len(predicted.regions))
            compiled = row.method == "torch.compile"
            row, _ = self.bench.measure(prepared, row, eager=not compiled)
            if compiled and self.has_conv:
                row = replace(row, measured_recompute_ratio=None,
                              note=row.note + "; recompute not measured: the profiler counts no FLOPs for "
                              "aten.convolution in compiled graphs")
        except Exception as exc:  # a peer that fails is reported, not fatal
            log.debug("peer %s failed", row.method, exc_info=True)
            row = replace(row, reason=exc.args[0] if isinstance(exc, peers.PeerUnavailable) else _why(exc))
        self.add(row)

    def ours_at_fractions(self) -> None:
        """Each of our solvers at each fraction, then the applied module without regions."""
        for f in self.fractions:
            for name in self.names:
                self.add(self._ours([name], parse_budget(f, self.graph), Row(name, "ours", budget=f), f"{name}@{f:g}"))
        # The applied module without regions: what running the traced, split module costs by itself.
        self.add(self._ours(["store-all"], self.sim_all.peak_bytes, Row("store-all", "ours", note="applied, no regions"),
                            "store-all"))

    def ours_at_peers(self) -> None:
        """Head to head: our optimal solvers (dp, ilp; the cheaper plan) at each peer's measured peak."""
        best = [s for s in ("dp", "ilp") if s in self.names] or self.names[-1:]
        if not best:
            return
        for peer in [r for r in self.rows if r.kind == "peer" and r.ran and r.method != "none"
                     and (r.budget is None or r.budget < 1)]:
            tag = peer.method + (f"@{peer.budget:g}" if peer.budget is not None else "")
            # simulate counts tensor storages: match the peer's storage peak when the meter saw it (eager)
            target = peer.meter_peak_bytes or peer.measured_peak_bytes
            row = Row(best[0], "ours", matched_to=tag, note=f"budget = {tag}'s measured peak")
            self.add(solve_below(lambda b, r: self._ours(best, b, r, "{solver} at " + f"{tag}'s peak"), target, row,
                                 metered=peer.meter_peak_bytes is not None, measured_target=peer.measured_peak_bytes))

    def _ours(self, names: Sequence[str], budget: int, row: Row, label: str) -> Row:
        """The cheapest plan of ``names`` at ``budget``, applied onto the model and measured."""
        graph = self.graph
        plans, needs = [], []
        for name in names:  # several: the cheapest plan that fits
            try:
                plans.append(solvers.solve(graph, budget, solver=name, **self.opts.get(name, {})))
            except InfeasibleBudget as exc:
                needs.append(getattr(exc, "min_feasible_bytes", None) or 0)
        if not plans:
            need = min(needs, default=0)
            return replace(row, reason=f"infeasible: needs {need / 2**20:.1f} MiB" if need else "infeasible")
        plan = min(plans, key=pick_key)
        name = plan.solver
        row = replace(row, method=name)
        label = label.replace("{solver}", name)
        sim = simulate(graph, plan, record=False)
        row = replace(row, predicted_peak_bytes=sim.peak_bytes, recompute_ratio=sim.recompute_ratio,
                      recompute_flops=sim.recompute_flops, recompute_cost=sim.recompute_cost,
                      predicted_extra_s=sim.recompute_time_s, solve_time_s=plan.solve_time_s, regions=len(plan.regions),
                      note=", ".join(x for x in (row.note, status_text(plan), f"gap {plan.gap:.1%}" if plan.gap else "") if x))
        key = plan_key(plan)
        if key in self.measured:
            first, done, _ = self.measured[key]
            return replace(done, method=name, budget=row.budget, matched_to=row.matched_to,
                           solve_time_s=plan.solve_time_s, note=f"{row.note}; same plan as {first}")
        from ..applying import planned

        try:
            # onto the model itself, switched on for the measured calls only (the reference runs beside it)
            row, tr = self.bench.measure(peers.Prepared(forward=planned(self.wl.model, plan), note=row.note), row)
        except Exception as exc:  # an apply failure is a finding, reported in the row
            log.warning("measuring %s (%s) failed", name, label, exc_info=True)
            return replace(row, reason=_why(exc))
        self.measured[key] = (label, row, tr)
        if row.budget is not None and (not self.best_trace or row.budget <= self.best_trace[0]):
            self.best_trace[:] = [row.budget, label, plan, tr]
        return row

    def result(self) -> Comparison:
        rows, bench = self.rows, self.bench
        if bench.ref_times:
            rows[0] = replace(rows[0], step_time_s=statistics.median(bench.ref_times))
        if self.best_trace:
            _, label, plan, tr = self.best_trace
            self.timelines[label] = timeline(simulate(self.graph, plan), tr, self.graph)
        meta = {**dict(self.wl.meta), "torch": torch.__version__, "machine": machine(), "repeats": self.repeats,
                "costs": self.costs, "store_all_predicted_bytes": self.sim_all.peak_bytes}
        out = Comparison(model=self.wl.name, meta=meta, fractions=self.fractions, rows=tuple(rows),
                         graph_nodes=len(self.graph), step_flops=bench.step_flops, timelines=self.timelines)
        from .claims import claims

        return replace(out, claims=tuple(claims(out)))
