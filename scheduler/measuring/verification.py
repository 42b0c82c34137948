"""Prove an applied plan on real training steps: it fits, gradients are unchanged, cost as predicted.

``verify(model, plan, args, loss=...)`` traces ``model`` once for the
plan's graph (the prediction, and the fingerprint check), applies ``plan``
onto the model itself (``scheduler.apply``, module lowering; ``lower="graph"``
or ``applied=`` for the traced-graph fallback), then, on the same inputs
and random seed:

* runs one step without and one with the plan and compares the loss, every
  parameter gradient and every buffer (BatchNorm statistics);
* measures the peak memory of a step of each by the allocator (CPU: the
  profiler's memory events, which see op workspaces and RNG
  states; CUDA: ``max_memory_allocated``) and by live tensor storages, and
  sets them beside ``simulate``'s prediction and the budget ("fits" is the
  allocator's number);
* times warm-up plus ``steps`` steps of each, alternating them in one run, and
  reports the ratio of the medians beside the predicted one
  (``1 + recompute FLOPs / step FLOPs``).

Each step runs the loop the plan was solved for (``Plan.loop``: the model's
output held through ``backward()`` or dropped before, NOTE [ The user's
loop ] in ``graphs.graph``), or the one ``loop=`` names, with the prediction
for that loop.

Parameters are not updated (no optimizer step), so both runs see the same
weights; buffers are restored between runs. The model is left as it was
given: the plan is removed again at the end (apply it yourself to train).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from graphs import CkptError
from solvers import Plan, format_bytes, simulate

from ..applying.graph import CheckpointedModule, apply as apply_graph
from ..applying import apply as apply_modules, applied_plan, planned, remove
from .steps import allocator_step_peak, grad_difference, grad_snapshot, measure_step_peak, time_steps
from .training import LossFn, clear_grads, seeded_step

__all__ = ["Verification", "VerifyError", "verify"]

log = logging.getLogger(__name__)


class VerifyError(CkptError, RuntimeError):
    """A step ``verify`` ran failed: the message says which step, and torch's first line (the error is chained)."""


@contextlib.contextmanager
def _step_failure(what: str) -> Iterator[None]:
    """An error of one of verify's steps as one :class:`VerifyError` line; the project's own errors pass as they are."""
    try:
        yield
    except CkptError:
        raise
    except Exception as exc:  # noqa: BLE001  (torch's errors from deep inside a step: named, not a traceback)
        log.debug("verify: %s failed", what, exc_info=True)  # the traceback, for ckpt -vv
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise VerifyError(f"verify: {what} failed with {type(exc).__name__}: {first.rstrip('.')} (the whole "
                          "traceback is chained to this error: run scheduler.verify in Python, or ckpt -vv)") from exc


@dataclass(frozen=True)
class Verification:
    """What :func:`verify` measured.

    Attributes:
        model: the graph's name.
        solver: the plan's solver.
        regions: number of checkpoint regions applied.
        budget_bytes: the plan's budget (None when it has none).
        predicted_peak_bytes: ``simulate(graph, plan).peak_bytes``.
        measured_peak_bytes: the allocator's peak of a real step with the plan.
        predicted_store_all_bytes: ``simulate(graph)`` without a plan.
        measured_store_all_bytes: the allocator's peak of a real step without the plan.
        counted_peak_bytes, counted_store_all_bytes: the same steps by live
            tensor storages (``scheduler.measuring.storages``; what ``simulate`` counts,
            without kernel workspaces).
        predicted_recompute_ratio: recompute FLOPs / step FLOPs.
        step_time_ratio: median step time with the plan / without.
        step_time_s: median step time without the plan (seconds).
        max_grad_diff: largest absolute difference over all parameter gradients.
        loss_diff: absolute difference of the losses.
        buffers_equal: every buffer equal after the two steps.
        loop: the loop the steps ran and the prediction is for (``"held"``, ``"dropped"``).
        predicted_recompute_s: the plan's predicted recompute time, what the solvers
            minimise (``Simulation.recompute_time_s``; None when the graph has no rate).
    """

    model: str
    solver: str
    regions: int
    budget_bytes: int | None
    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_store_all_bytes: int
    measured_store_all_bytes: int
    predicted_recompute_ratio: float
    step_time_ratio: float
    step_time_s: float
    max_grad_diff: float
    loss_diff: float
    buffers_equal: bool
    counted_peak_bytes: int = 0
    counted_store_all_bytes: int = 0
    loop: str = "held"
    predicted_recompute_s: float | None = None

    @property
    def fits(self) -> bool:
        """Measured peak within the budget (always true without a budget)."""
        return self.budget_bytes is None or self.measured_peak_bytes <= self.budget_bytes

    @property
    def peak_error(self) -> float:
        """(measured - predicted) / predicted."""
        return (self.measured_peak_bytes - self.predicted_peak_bytes) / max(self.predicted_peak_bytes, 1)

    @property
    def over_budget_bytes(self) -> int:
        """How far the measured peak is above the budget (0 when it fits or there is no budget)."""
        return 0 if self.budget_bytes is None else max(0, self.measured_peak_bytes - self.budget_bytes)

    def peak_error_text(self) -> str:
        """The peak error in bytes and percent: ``+1,024 B (+0.048 %)``. A percentage alone rounds a small
        difference to ``+0.0 %``, which beside a failed budget reads as a contradiction."""
        diff = self.measured_peak_bytes - self.predicted_peak_bytes
        return f"{diff:+,} B ({100 * self.peak_error:+.3g} %)" if diff else "0 B (exact)"

    @property
    def predicted_time_ratio(self) -> float:
        return 1.0 + self.predicted_recompute_ratio

    def grads_equal(self, atol: float = 0.0) -> bool:
        return self.max_grad_diff <= atol and self.loss_diff <= atol and self.buffers_equal

    def rows(self) -> list[tuple[str, str, str]]:
        """``(quantity, with the plan, without)`` rows for a table."""
        budget = format_bytes(self.budget_bytes) if self.budget_bytes else "-"
        return [
            ("peak measured (allocator)", format_bytes(self.measured_peak_bytes),
             format_bytes(self.measured_store_all_bytes)),
            ("peak measured (tensor storages)", format_bytes(self.counted_peak_bytes),
             format_bytes(self.counted_store_all_bytes)),
            ("peak predicted", format_bytes(self.predicted_peak_bytes), format_bytes(self.predicted_store_all_bytes)),
            ("budget", budget, ""),
            ("loop (model output through backward)", self.loop, ""),
            ("fits the budget", "yes" if self.fits else f"NO, {self.over_budget_bytes:,} B over", ""),
            ("peak error (measured vs predicted)", self.peak_error_text(), ""),
            ("step time ratio (median)", f"{self.step_time_ratio:.3f}", f"1 ({1000 * self.step_time_s:.1f} ms)"),
            ("step time ratio predicted", f"{self.predicted_time_ratio:.3f}", ""),
            ("recompute ratio predicted", f"{100 * self.predicted_recompute_ratio:.1f}%", ""),
            ("recompute time predicted", "-" if self.predicted_recompute_s is None
             else f"{1000 * self.predicted_recompute_s:.1f} ms", ""),
            ("max gradient difference", f"{self.max_grad_diff:.3g}", ""),
            ("loss difference", f"{self.loss_diff:.3g}", ""),
            ("buffers equal", "yes" if self.buffers_equal else "NO", ""),
        ]


def verify(model: nn.Module, plan: Plan, args: Any, kwargs: dict | None = None, *, loss: LossFn | None = None,
           applied: CheckpointedModule | None = None, steps: int = 5, warmup: int = 1, seed: int = 0,
           measure_memory: bool = True, name: str | None = None, lower: str = "module",
           graph: Any = None, loop: str | None = None) -> Verification:
    """Run steps with and without ``plan`` and compare them.

    Args:
        model: the user's module (train mode for a training step).
        plan: the plan (checked against the traced graph).
        args, kwargs: the step's inputs.
        loss: ``loss(outputs) -> scalar`` when the model does not return its
            loss; it is traced with the model (as in ``scheduler.trace(...,
            loss=)``), so the applied module returns the loss. Without it the
            model must return a scalar loss.
        applied: a module from the graph-level applier (skips applying;
            must have been applied with the same ``loss``).
        lower: ``"module"`` (the plan applied onto ``model`` itself, switched
            on and off between the runs) or ``"graph"`` (the traced copy,
            which returns the loss alone: its step drops the model's output
            whatever ``loop`` says).
        graph: the plan's cost graph, when already traced at these inputs
            (else ``model`` is traced once, as the plan's graph was).
        name: the graph's name as traced (see :func:`scheduler.applying.graph.apply`).
        steps: measured steps of each kind for the time ratio (median).
        warmup: un-timed steps of each kind first.
        seed: RNG seed both runs start from (dropout masks equal).
        measure_memory: also measure the peaks (a slower, instrumented step each).
        loop: ``"held"`` (the step keeps the model's output through
            ``backward()``) or ``"dropped"``; None: the plan's (``Plan.loop``),
            else ``"held"``. The prediction is the graph's for that loop.

    Returns:
        A :class:`Verification`.

    Raises:
        PlanMismatch: the plan was solved for another model, shape or dtype.
        VerifyError: a step failed (one line naming the step and torch's error, which it chains).
    """
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(kwargs or {})
    was_applied = applied_plan(model)
    if was_applied is not None:
        remove(model)
    if applied is None and lower == "graph":
        applied = apply_graph(model, plan, args, kwargs, loss=loss, name=name)
    if applied is not None:
        losses: dict[str, LossFn | None] = {"all": loss, "plan": None}
        graph = applied.graph
        count = len(applied.regions)
    else:
        if graph is None:
            from .. import applying  # noqa: F401  (NOTE [ Recompute timed in the step ])
            from ..tracing.tracer import capture_for_plan

            graph = capture_for_plan(model, plan, args, kwargs, loss=loss, name=name).graph
        plan.check_graph(graph)
        applied = planned(model, plan)
        losses = {"all": loss, "plan": loss}
        count = len(plan.regions)
    loop = loop or plan.loop or "held"
    try:
        return _run(model, plan, graph.with_loop(loop), applied, count, args, kwargs, losses, steps=steps,
                    warmup=warmup, seed=seed, measure_memory=measure_memory)
    finally:
        if was_applied is not None:
            apply_modules(model, was_applied, check=False)


def _run(model: nn.Module, plan: Plan, graph: Any, applied: nn.Module, count: int, args: tuple, kwargs: dict,
         losses: dict[str, LossFn | None], *, steps: int, warmup: int, seed: int, measure_memory: bool
         ) -> Verification:
    sim_plan = simulate(graph, plan, record=False)
    sim_all = simulate(graph, None, record=False)
    buffers = list(model.buffers())
    initial = [b.detach().clone() for b in buffers]
    params = list(model.parameters())
    modules = {"all": model, "plan": applied}
    loop = graph.loop
    steps_of = {key: seeded_step(module, args, kwargs, losses[key], seed=seed, loop=loop)
                for key, module in modules.items()}

    def reset() -> None:
        with torch.no_grad():
            for b, s in zip(buffers, initial):
                b.copy_(s)
        clear_grads(model)

    # Equality: same seed, same weights, same starting buffers.
    reset()
    with _step_failure("the step without the plan"):
        l0 = steps_of["all"]()
    g0, b0 = grad_snapshot(params), [b.detach().clone() for b in buffers]
    reset()
    with _step_failure("the step with the plan"):
        l1 = steps_of["plan"]()
    max_diff, _ = grad_difference(params, g0, strict=True, names=[n for n, _ in model.named_parameters()])
    buffers_equal = all(torch.equal(x, b.detach()) for x, b in zip(b0, buffers))
    loss_diff = float((l0.double() - l1.double()).abs())

    measured, counted = {}, {}
    if measure_memory:
        for key, module in modules.items():
            what = "the step with the plan" if key == "plan" else "the step without the plan"
            reset()
            torch.manual_seed(seed)
            with _step_failure(f"{what}, measured by tensor storages,"):
                counted[key] = measure_step_peak(module, model, args, kwargs, losses[key], loop=loop)
            reset()
            torch.manual_seed(seed)
            with _step_failure(f"{what}, measured by the allocator,"):
                measured[key] = allocator_step_peak(module, model, args, kwargs, losses[key], loop=loop)

    # Time: warm-up, then the two alternated in one run (ABBA), median of each.
    with _step_failure("a timed step"):
        for _ in range(warmup):
            for step in steps_of.values():
                clear_grads(model)
                step()
        t_plan, base = time_steps(steps_of["plan"], steps_of["all"], repeats=steps,
                                  before_each=lambda: clear_grads(model))
    reset()
    result = Verification(
        model=graph.name, solver=plan.solver, regions=count, budget_bytes=plan.budget_bytes,
        predicted_peak_bytes=sim_plan.peak_bytes, measured_peak_bytes=measured.get("plan", 0),
        predicted_store_all_bytes=sim_all.peak_bytes, measured_store_all_bytes=measured.get("all", 0),
        predicted_recompute_ratio=sim_plan.recompute_ratio, predicted_recompute_s=sim_plan.recompute_time_s,
        step_time_ratio=t_plan / base if base else float("nan"), step_time_s=base,
        max_grad_diff=max_diff, loss_diff=loss_diff, buffers_equal=buffers_equal,
        counted_peak_bytes=counted.get("plan", 0), counted_store_all_bytes=counted.get("all", 0), loop=loop,
    )
    log.info("verified %s/%s: peak %d (predicted %d), time x%.3f, grad diff %.3g", result.model, result.solver,
             result.measured_peak_bytes, result.predicted_peak_bytes, result.step_time_ratio, result.max_grad_diff)
    return result
