"""The allocator's peak of one training step of a (planned) model under ``torch.compile``, and its time.

What :func:`scheduler.solve_compiled` measures each plan by (:func:`compiled_step`; NOTE [ Compile-aware budget ]
in ``scheduler.sizing.compiled``): a copy of the user's model, the plan applied onto the copy, compiled, two
warm-up steps (the forward's and the backward's compiles), then one step measured by
:func:`scheduler.measuring.steps.allocator_step_peak`, then a few steps timed. The user's model, its gradients, BatchNorm statistics
and the random number generators are left as they were.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..applying import apply
from .steps import LossFn, allocator_step_peak, clear_grads
from .training import training_step

__all__ = ["compiled_step", "compiled_step_peak"]

log = logging.getLogger(__name__)


def _own_backend(backend: str | Callable[..., Any]) -> Callable[..., Any]:
    """``backend`` behind a function of its own: Dynamo's cache is per code object and per backend, and a copy
    of a model passes the guards of the copy compiled before it (whose graph, with another plan, would run)."""
    if callable(backend):
        inner = backend
    else:
        from torch._dynamo.backends.registry import lookup_backend

        inner = lookup_backend(backend)

    def compiled_backend(gm: Any, example_inputs: Any) -> Any:
        return inner(gm, example_inputs)

    return compiled_backend


def compiled_step_peak(model: nn.Module, plan: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
                       loss: LossFn | None = None, *, backend: str | Callable[..., Any] = "inductor",
                       options: Mapping[str, Any] | None = None, loop: str = "held") -> int:
    """Peak bytes of a training step of ``model`` with ``plan`` applied (None: unplanned), compiled
    (:func:`compiled_step`, untimed)."""
    return compiled_step(model, plan, args, kwargs, loss, backend=backend, options=options, loop=loop, timed=0)[0]


def compiled_step(model: nn.Module, plan: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
                  loss: LossFn | None = None, *, backend: str | Callable[..., Any] = "inductor",
                  options: Mapping[str, Any] | None = None, loop: str = "held", timed: int = 5
                  ) -> tuple[int, float | None]:
    """Peak bytes of a training step of ``model`` with ``plan`` applied (None: unplanned), compiled, and the
    median wall time of ``timed`` more steps (None with ``timed=0``; on CUDA, synchronized).

    Args:
        model: the user's model (not changed: a copy is planned and compiled).
        plan: a ``solvers.Plan`` for ``model``'s graph, or None.
        args, kwargs, loss, loop: one training step, as ``scheduler.trace`` took it.
        backend: ``torch.compile``'s backend; options: its other keyword arguments (``mode``, ``fullgraph``...).
    """
    import statistics

    args, kwargs = tuple(args), dict(kwargs or {})
    t0 = time.perf_counter()
    devices = [d.index or 0 for d in {t.device for t in model.parameters()} if d.type == "cuda"]

    def sync() -> None:
        for d in devices:
            torch.cuda.synchronize(d)

    with torch.random.fork_rng(devices=devices):
        planned = copy.deepcopy(model)
        if plan is not None:
            apply(planned, plan)
        fn = torch.compile(planned, backend=_own_backend(backend), **dict(options or {}))
        for _ in range(2):  # the forward's and the backward's compiles
            clear_grads(planned)
            training_step(fn, args, kwargs, loss, loop=loop)
        peak = allocator_step_peak(fn, planned, args, kwargs, loss, loop=loop)
        took = []
        for _ in range(timed):
            clear_grads(planned)
            sync()
            start = time.perf_counter()
            training_step(fn, args, kwargs, loss, loop=loop)
            sync()
            took.append(time.perf_counter() - start)
    step_s = statistics.median(took) if took else None
    log.info("compiled step %s: %.2f MiB by the allocator%s (%.1f s with its compile)",
             "unplanned" if plan is None else "planned", peak / 2**20,
             "" if step_s is None else f", {1e3 * step_s:.1f} ms a step", time.perf_counter() - t0)
    del fn, planned
    return peak, step_s
