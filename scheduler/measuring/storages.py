"""Measure the peak memory of real work, on any device (CPU included).

NOTE [ Counting like simulate ]
    :func:`measure_peak` counts tensor *storages*: a ``TorchDispatchMode`` sees
    every aten op, registers each new output storage with its size, and a
    ``weakref.finalize`` on the storage subtracts it when the storage dies
    (views share a storage and are counted once). Tensors alive before the
    call are passed as ``live`` and counted as a constant base. So the measure
    counts what ``solvers.model.simulate`` counts: parameters and inputs (the base),
    then activations, saved buffers, gradients of activations and of
    parameters, as they are created and freed. Allocator caching, kernel
    workspaces and the Python heap are not counted (they are not tensors).

    One thing the mode itself changes: while any dispatch mode is active,
    autograd adds a second gradient contribution *out of place*
    (``old + new``, a third buffer for a moment) where a plain run adds it in
    place (``old.add_(new)``, what ``simulate`` assumes), because the engine
    then treats every tensor as subclass-like. Checked on a block whose
    input feeds two branches: ``aten::add_`` in the profiler's trace of a
    plain backward, ``aten.add.Tensor`` under this mode. So at such a step
    this count can exceed both the real run and the prediction by up to one
    gradient (1,216 bytes over on that block); ``scheduler.measuring.profiler`` (the
    allocator's events, no mode) sees the real run.

:func:`measure_step` runs one training step (forward, the loss, backward) of
a module with ``.grad`` set to None first, so the numbers compare with
``simulate(graph, plan).peak_bytes`` of the graph traced from the same call.

Example:
    >>> m = measure_step(model, (x,), {"targets": y})
    >>> m.peak_bytes, m.base_bytes
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..tracing.records import storage_bytes, storage_key  # the one storage id and size of the tracer and the meter
from .training import clear_grads, step_tensors, training_step

__all__ = ["MemoryMeasurement", "measure_peak", "measure_step", "storage_key", "live_storages", "live_bytes_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryMeasurement:
    """What :func:`measure_peak` saw.

    Attributes:
        peak_bytes: highest total bytes live (base included).
        base_bytes: bytes of the ``live`` tensors (parameters, buffers, inputs).
        end_bytes: bytes live when the function returned (base included).
        peak_op: the aten op after which the peak was reached.
        timeline: ``(op name, live bytes)`` after each op, when asked for.
        result: what the function returned.
    """

    peak_bytes: int
    base_bytes: int
    end_bytes: int
    peak_op: str
    timeline: tuple[tuple[str, int], ...] = ()
    result: Any = None

    @property
    def activation_peak_bytes(self) -> int:
        """Peak minus the base."""
        return self.peak_bytes - self.base_bytes


def live_storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    """The distinct storages behind ``tensors``: key (:func:`storage_key`) -> bytes."""
    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            k = storage_key(t)
            if k is not None and k not in out:
                out[k] = storage_bytes(t)  # on CUDA whole allocator blocks (NOTE [ CUDA blocks ])
    return out


def live_bytes_of(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views count once; ``meta`` tensors hold none)."""
    return sum(live_storages(t for t in tensors if isinstance(t, torch.Tensor) and t.device.type != "meta").values())


class _StorageTracker(TorchDispatchMode):
    def __init__(self, known: set[int], base: int, record: bool):
        super().__init__()
        self.known = set(known)
        self.live = base
        self.peak = base
        self.peak_op = ""
        self.record = record
        self.timeline: list[tuple[str, int]] = []

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.known.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            k = storage_key(t)
            if k is None or k in self.known:
                continue
            st = t.untyped_storage()
            nbytes = storage_bytes(t)
            self.known.add(k)
            self.live += nbytes
            weakref.finalize(st, self._freed, k, nbytes)
        if self.live > self.peak:
            self.peak = self.live
            self.peak_op = str(func)
        if self.record:
            self.timeline.append((str(func), self.live))
        return out


def measure_peak(fn: Callable[[], Any], *, live: Sequence[torch.Tensor] = (), timeline: bool = False
                 ) -> MemoryMeasurement:
    """Run ``fn()`` and measure the peak bytes of tensor storages (NOTE [ Counting like simulate ]).

    Args:
        fn: the work (e.g. a training step); called once with no argument.
        live: tensors alive before and throughout (parameters, buffers,
            inputs): counted once as the base, never as new allocations.
        timeline: also return ``(op, live bytes)`` after every op.

    Returns:
        A :class:`MemoryMeasurement`; ``result`` is what ``fn`` returned.
    """
    storages = live_storages(live)
    base = sum(storages.values())
    tracker = _StorageTracker(set(storages), base, timeline)
    with tracker:
        result = fn()
    return MemoryMeasurement(peak_bytes=tracker.peak, base_bytes=base, end_bytes=tracker.live,
                             peak_op=tracker.peak_op, timeline=tuple(tracker.timeline), result=result)


def measure_step(model: torch.nn.Module, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
                 loss: Callable[[Any], torch.Tensor] | None = None, timeline: bool = False,
                 run: Callable[..., Any] | None = None, loop: str = "held") -> MemoryMeasurement:
    """Peak memory of one training step: forward, loss, backward.

    Gradients are set to None first (the optimizer's ``zero_grad(set_to_none=True)``),
    parameters, buffers and inputs are the base; the loss is dropped only after
    the backward, and the rest of the output (e.g. logits) too with
    ``loop="held"``, or right after the loss is taken from it with
    ``loop="dropped"`` (``scheduler.measuring.training.training_step``).

    Args:
        model: the module (its parameters and buffers are the base).
        args, kwargs: the inputs.
        loss: ``loss(output) -> scalar`` when the model does not return its loss.
        timeline: record ``(op, live bytes)`` after each op.
        run: what to call instead of ``model`` (e.g. a checkpointed version of
            it sharing the parameters); called as ``run(*args, **kwargs)``.

    Returns:
        A :class:`MemoryMeasurement` whose ``result`` is the loss value (float).
    """
    args, kwargs = tuple(args), dict(kwargs or {})
    clear_grads(model)
    call = run if run is not None else model
    return measure_peak(lambda: float(training_step(call, args, kwargs, loss, loop=loop)),
                        live=step_tensors(model, args, kwargs),
                        timeline=timeline)
