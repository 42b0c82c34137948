"""Measuring training steps the same way wherever a step is measured: their peaks, gradients and time.

``verify`` (a plan against the plain step) and ``ckpt compare`` (every method
against the plain step) both run forward, loss and backward with gradients
cleared first, compare gradients with a reference step's, and time two steps
alternately; they do it through these helpers (the step itself in
``scheduler.measuring.training``) so that their numbers mean the same thing.

Example:
    >>> step = seeded_step(model, args, kwargs, loss, seed=0)
    >>> clear_grads(model); step(); reference = grad_snapshot(params)
    >>> t_plan, t_plain = time_steps(plan_step, step, repeats=5, before_each=lambda: clear_grads(model))
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from .profiler import profile_step
from .storages import live_bytes_of, measure_step
from .training import LossFn, clear_grads, step_tensors, training_step

__all__ = ["time_steps", "grad_snapshot", "grad_difference", "allocator_step_peak", "measure_step_peak"]

log = logging.getLogger(__name__)


def time_steps(step: Callable[[], Any], reference: Callable[[], Any], *, repeats: int,
               before_each: Callable[[], None] | None = None) -> tuple[float, float]:
    """Median seconds of ``step`` and of ``reference``, run alternately.

    Alternating the two in the same window makes the ratio robust to the
    machine's drift (frequency scaling, other processes).

    Args:
        step: the method's step (already warmed up).
        reference: the un-checkpointed step (already warmed up).
        repeats: timed runs of each.
        before_each: called, untimed, before every run (clears gradients).

    Returns:
        ``(median_step_s, median_reference_s)``.
    """
    ts, tr = [], []
    pair = ((reference, tr), (step, ts))
    for i in range(max(1, repeats)):
        # ABBA order: each runs after itself as often as after the other, so
        # what a step leaves behind (allocator state, caches) and linear drift
        # weigh on both alike.
        for fn, acc in (pair if i % 2 == 0 else pair[::-1]):
            if before_each is not None:
                before_each()
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ts), statistics.median(tr)


def grad_snapshot(params: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Detached copies of the parameters' gradients."""
    return [None if p.grad is None else p.grad.detach().clone() for p in params]


def grad_difference(params: Sequence[torch.Tensor], reference: Sequence[torch.Tensor | None], *,
                    strict: bool = False, names: Sequence[str] | None = None) -> tuple[float, float]:
    """Largest absolute difference of gradients from ``reference``, and relative to its largest entry.

    Differences are taken in float64. A gradient missing on one side only
    counts as the whole reference gradient, or, with ``strict``, makes the
    difference infinite (logged with its parameter's name from ``names``).

    Returns:
        ``(max_abs_diff, max_abs_diff / max_abs_reference)``.
    """
    worst = 0.0
    scale = 0.0
    for i, (p, ref) in enumerate(zip(params, reference)):
        got = p.grad
        if strict and (got is None) != (ref is None):
            log.warning("gradient of %s is None in one run only", names[i] if names else f"parameter {i}")
            worst = float("inf")
            continue
        if ref is None or not ref.numel():
            continue
        scale = max(scale, float(ref.abs().max()))
        diff = ref.abs().max() if got is None else (got.detach().double() - ref.double()).abs().max()
        worst = max(worst, float(diff))
    return worst, (worst / scale if scale else 0.0)


def measure_step_peak(module: nn.Module, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
                      loss: LossFn | None, *, loop: str = "held") -> int:
    """Peak bytes of one training step of ``module`` (sharing ``model``'s parameters), by live tensor storages.

    Parameter gradients start at None; parameters, buffers and inputs count as
    the base (:func:`scheduler.measuring.storages.measure_step`, NOTE [ Counting like simulate ]).
    """
    return measure_step(model, tuple(args), dict(kwargs), loss=loss, run=module, loop=loop).peak_bytes


def allocator_step_peak(module: nn.Module, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
                        loss: LossFn | None, *, loop: str = "held") -> int:
    """Peak bytes of one training step by the allocator: what "fits" means.

    CUDA: ``torch.cuda.max_memory_allocated`` over the step. Elsewhere: the
    profiler's memory events (NOTE [ Measuring with profiler events ] in
    ``scheduler.measuring.profiler``) on top of the parameters, buffers and inputs.
    """
    args, kwargs = tuple(args), dict(kwargs)
    clear_grads(model)
    live = step_tensors(model, args, kwargs)
    device = next((t.device for t in live), torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        training_step(module, args, kwargs, loss, loop=loop)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base + live_bytes_of(live)

    def step() -> None:
        training_step(module, args, kwargs, loss, loop=loop)

    return profile_step(step, baseline_bytes=live_bytes_of(live)).peak_bytes
