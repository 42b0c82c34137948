"""One training step, run the same way wherever a step is measured: seeded, its peaks, gradients and time.

``verify`` (a plan against the plain step) and ``ckpt compare`` (every method
against the plain step) both run forward, loss and backward with gradients
cleared first, compare gradients with a reference step's, and time two steps
alternately; they do it through these helpers so that their numbers mean the
same thing.

Example:
    >>> step = seeded_step(model, args, kwargs, loss, seed=0)
    >>> clear_grads(model); step(); reference = grad_snapshot(params)
    >>> t_plan, t_plain = time_steps(plan_step, step, repeats=5, before_each=lambda: clear_grads(model))
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from graphs import LOOPS

from ..applying.selective import tally

__all__ = ["LossFn", "clear_grads", "step_tensors", "training_step", "seeded_step", "time_steps", "grad_snapshot",
           "grad_difference", "allocator_step_peak", "measure_step_peak", "count_step_flops"]

log = logging.getLogger(__name__)

LossFn = Callable[[Any], torch.Tensor]


def clear_grads(params: nn.Module | Iterable[torch.Tensor]) -> None:
    """Set the gradients of a module's parameters (or of ``params``) to None, as ``zero_grad(set_to_none=True)``."""
    for p in params.parameters() if isinstance(params, nn.Module) else params:
        p.grad = None


def step_tensors(model: nn.Module, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
                 ) -> list[torch.Tensor]:
    """What is alive before and throughout a step: parameters, buffers and the input tensors (the base)."""
    leaves = torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs or {})))
    return list(model.parameters()) + list(model.buffers()) + [t for t in leaves if isinstance(t, torch.Tensor)]


def training_step(run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                  loss: LossFn | None = None, *, loop: str = "held") -> torch.Tensor:
    """Forward, loss, backward; returns the loss, detached.

    The loss is dropped only after the backward, as in a training loop; the
    rest of the output (e.g. logits) after the backward too with ``loop="held"``
    (``out = model(**batch); out.loss.backward()``), or as soon as the loss is
    taken from it with ``loop="dropped"`` (``Trainer``): NOTE [ The user's loop ]
    in ``graphs.graph``.

    Raises:
        TypeError: the step does not produce a scalar loss (pass ``loss=``).
        ValueError: ``loop`` is neither ``"held"`` nor ``"dropped"``.
    """
    if loop not in LOOPS:
        raise ValueError(f"loop={loop!r} is not one of {', '.join(map(repr, LOOPS))}")
    out = run(*args, **kwargs)
    value = loss(out) if loss is not None else out
    if loop == "dropped":
        del out
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise TypeError("the step must produce a scalar loss tensor; pass loss= to reduce the model's output")
    value.backward()
    return value.detach()


def seeded_step(run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], loss: LossFn | None = None,
                *, seed: int | None = 0, loop: str = "held") -> Callable[[], torch.Tensor]:
    """``step()`` running :func:`training_step` from ``torch.manual_seed(seed)`` (dropout masks equal on every run)."""
    args, kwargs = tuple(args), dict(kwargs)

    def step() -> torch.Tensor:
        if seed is not None:
            torch.manual_seed(seed)
        return training_step(run, args, kwargs, loss, loop=loop)

    return step


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
    from .storages import measure_step

    return measure_step(model, tuple(args), dict(kwargs), loss=loss, run=module, loop=loop).peak_bytes


def allocator_step_peak(module: nn.Module, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
                        loss: LossFn | None, *, loop: str = "held") -> int:
    """Peak bytes of one training step by the allocator: what "fits" means.

    CUDA: ``torch.cuda.max_memory_allocated`` over the step. Elsewhere: the
    profiler's memory events (NOTE [ Measuring with profiler events ] in
    ``scheduler.measuring.profiler``) on top of the parameters, buffers and inputs.
    """
    from .profiler import profile_step
    from .storages import live_bytes_of

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


def count_step_flops(step: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """FLOPs of the kernels one eager ``step`` really ran, and what the selective modes served.

    NOTE [ Counting what a selective policy served ] (``scheduler.applying.selective``):
    a ``FlopCounterMode`` around the step counts each call that reaches the
    kernels once (a kept call served from the store, or the call at which a
    checkpoint stops its recompute, not at all), where the profiler counts
    every call it sees enter the dispatcher. Returns ``(flops, tally)``,
    ``tally`` the selective modes' counts (:class:`~scheduler.applying.selective.Tally`).
    """
    from torch.utils.flop_counter import FlopCounterMode

    with tally() as seen, FlopCounterMode(display=False) as fc:
        step()
    return int(fc.get_total_flops()), seen.as_dict()
