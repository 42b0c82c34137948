"""The Checkmate max-batch protocol: the largest batch each method fits under one budget.

Checkmate (Jain et al., MLSys 2020, Fig. 5) fixes a memory budget and asks,
per method, for the largest batch size whose training step fits: on VGG-19
its ILP reached 289 against 167 for storing everything (1.73x), with 197 for
Chen's sqrt(n) and 266 for Chen's greedy. Here the search runs on the
simulator (re-tracing the model at each batch, since every size changes; the
galloping bisection of ``scheduler.sizing.search.search_largest``), and each answer is
confirmed by one measured step at that batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

import solvers
from graphs import Graph
from solvers import InfeasibleBudget, Plan

from scheduler.sizing.search import search_largest

__all__ = ["MaxBatch", "max_batches", "CHECKMATE_VGG19", "VGG_MAXBATCH", "vgg_maxbatch_setup"]

log = logging.getLogger(__name__)

#: Checkmate's published VGG-19 max batch sizes (Jain et al. 2020, Fig. 5).
CHECKMATE_VGG19 = {"store-all": 167, "chen-sqrt": 197, "chen-greedy": 266, "ilp": 289}

#: Checkmate protocol on VGG-19: model options (batch is searched), budget, search range.
VGG_MAXBATCH = {
    False: (dict(width=16, hidden=512, classes=100, image_size=64), 320 * 2**20, 1024),
    True: (dict(width=8, hidden=64, classes=10, image_size=32), 24 * 2**20, 256),
}


@dataclass(frozen=True)
class MaxBatch:
    """One method's largest batch under the budget.

    Attributes:
        method: solver name.
        batch: largest batch whose plan fits (None: not even the smallest).
        capped: the search's upper end fits (the true answer may be larger).
        ratio: ``batch`` over store-all's.
        predicted_peak_bytes: simulated peak at ``batch``.
        measured_peak_bytes: peak of one real step at ``batch``, from the
            profiler's allocator events (kernel workspaces included); None if
            not confirmed.
        meter_peak_bytes: the same step's peak of tensor storages
            (``scheduler.measuring.storages``: what ``simulate`` models).
        recompute_ratio: predicted recompute / step FLOPs at ``batch``.
        search_s: wall time of the search (solves and traces not cached).
        reason: why there is no answer (the error), else None.
    """

    method: str
    batch: int | None
    capped: bool = False
    ratio: float | None = None
    predicted_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None
    meter_peak_bytes: int | None = None
    recompute_ratio: float | None = None
    search_s: float = 0.0
    reason: str | None = None


def max_batches(graph_at: Callable[[int], Graph], budget_bytes: int, methods: Sequence[str], *, hi: int,
                lo: int = 1, options: Mapping[str, Mapping[str, Any]] | None = None,
                confirm: Callable[[int, Plan], tuple[int, int | None]] | None = None,
                progress: Callable[[str], None] | None = None) -> list[MaxBatch]:
    """The largest batch in ``[lo, hi]`` each method plans under ``budget_bytes``.

    Args:
        graph_at: the model's cost graph at a batch size (called once per size).
        budget_bytes: the whole-step budget (parameters, gradients, activations).
        methods: solver names (``store-all`` first gives the ratios' base).
        hi, lo: the search range.
        options: per-solver options.
        confirm: ``confirm(batch, plan) -> (profiler peak, storage peak)`` of
            one real step.
        progress: called with one line per method.

    Returns:
        One :class:`MaxBatch` per method, in order.
    """
    say = progress or (lambda s: log.info("%s", s))
    graphs_cache: dict[int, Graph] = {}
    opts = {k: dict(v) for k, v in (options or {}).items()}

    def graph(b: int) -> Graph:
        if b not in graphs_cache:
            graphs_cache[b] = graph_at(b)
        return graphs_cache[b]

    def plan_at(method: str, b: int) -> Plan | None:
        try:
            return solvers.solve(graph(b), budget_bytes, solver=method, **opts.get(method, {}))
        except InfeasibleBudget:
            return None

    out: list[MaxBatch] = []
    base: int | None = None
    for method in methods:
        t0 = time.perf_counter()
        try:
            best, capped = search_largest(lambda b, _phase: plan_at(method, b) is not None, lo, hi)
        except Exception as exc:  # one failing solver is a row with its reason, not the end of the benchmark
            log.warning("max batch of %s failed", method, exc_info=True)
            out.append(MaxBatch(method, None, reason=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        elapsed = time.perf_counter() - t0
        if best is None:
            out.append(MaxBatch(method, None, search_s=elapsed, reason=f"batch {lo} does not fit"))
            say(f"{method}: nothing fits")
            continue
        plan = plan_at(method, best)
        assert plan is not None  # the search just found it feasible
        sim = solvers.simulate(graph(best), plan, record=False)
        if method == "store-all":
            base = best
        measured = meter = None
        if confirm is not None:
            try:
                measured, meter = confirm(best, plan)
            except Exception as exc:  # the confirmation step is a measurement; report its failure
                log.warning("confirming %s at batch %d failed: %s", method, best, exc)
        row = MaxBatch(method, best, capped, best / base if base else None, sim.peak_bytes, measured, meter,
                       sim.recompute_ratio, elapsed)
        out.append(row)
        say(f"{method}: batch {best}{' (capped)' if capped else ''}, predicted {sim.peak_bytes / 2**20:.1f} MiB"
            + (f", measured {measured / 2**20:.1f} MiB" if measured else "") + f" ({elapsed:.1f}s)")
    return out


def vgg_maxbatch_setup(*, quick: bool, workspaces: str = "none"
                       ) -> tuple[Callable[[int], Graph], Callable[[int, Plan], tuple[int, int]], int, int, dict]:
    """``(graph_at, confirm, budget_bytes, hi, meta)`` for the max-batch protocol on VGG-19.

    ``graph_at(b)`` traces VGG-19 on the meta device at batch ``b`` (nothing
    allocated), planned for the CPU that ``confirm`` runs it on; ``confirm(b, plan)`` builds it for real at batch ``b``,
    applies the plan and returns the peak of one step by the profiler and by
    ``scheduler.measuring.storages`` (tensor storages).
    """
    from scheduler.applying.graph import apply
    from scheduler.measuring.steps import allocator_step_peak, measure_step_peak
    from scheduler.models import build
    from scheduler.tracing.tracer import capture

    opts, budget, hi = VGG_MAXBATCH[quick]

    def graph_at(b: int) -> Graph:
        torch.manual_seed(0)
        ex = build("vgg19", batch=b, device="meta", **opts)
        # planned for the CPU, where confirm runs it (a meta model is otherwise planned for an H100, whose
        # kernels this machine cannot run); workspaces="measure": each op's backward run once on the CPU
        return capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, workspaces=workspaces, target="cpu").graph

    def confirm(b: int, plan: Plan) -> tuple[int, int]:
        torch.manual_seed(0)
        ex = build("vgg19", batch=b, **opts)
        # the meta-device graph and the real one are the same graph: apply checks the fingerprint
        module = apply(ex.model, plan, ex.args, ex.kwargs, loss=ex.loss) if plan.regions else ex.model
        loss = ex.loss if not plan.regions else None  # an applied plan returns the loss itself
        return (allocator_step_peak(module, ex.model, ex.args, ex.kwargs, loss),
                measure_step_peak(module, ex.model, ex.args, ex.kwargs, loss))

    return graph_at, confirm, budget, hi, {**opts, "search": f"batch 1..{hi}"}
