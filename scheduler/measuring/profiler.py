"""Measure a training step with the profiler: peak memory, timeline, FLOPs, time.

NOTE [ Measuring with profiler events ]
    ``ckpt compare`` measures every method the same way, compiled or eager:
    a ``TorchDispatchMode`` (``MemTracker``, ``scheduler.measuring.storages``) does not
    see code that ``torch.compile`` produced (dynamo falls back to eager under
    a dispatch mode), but the allocator reports every allocation and free to
    ``torch.profiler`` when ``profile_memory=True``. The peak of a step is the
    highest running sum of those events (ordered by time), plus what was
    alive before the step started: parameters, buffers and inputs (gradients
    are cleared before the step, so their allocation is inside the events).
    The same profile counts the FLOPs of the matmul and convolution kernels
    that ran (``with_flops=True``): the difference with the un-checkpointed
    step is the recomputation a method really did.

    A free during the step of what was allocated before it lowers the
    running sum as the gradients of an earlier step would, so Python's
    cyclic collector is off while the step runs (back as it was after): the
    4-stage GPipe's first stage measured 1,342,720 B in some runs and
    1,054,976 B in others, those where a collection during its step freed
    the earlier runs' reference cycles (their tensors among them). Garbage
    from before stays, unfreed, until after the step (no ``gc.collect``
    first: a full collection cost 0.22 s a step in the test suite, more as
    its heap grew); a step's own cycles live to its end, as they may in any
    step: the measure does not depend on when the collector runs.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch.profiler import ProfilerActivity, profile

__all__ = ["MemoryTrace", "profile_step", "downsample", "quiet_profile"]

log = logging.getLogger(__name__)

def quiet_profile(**options: Any) -> profile:
    """``torch.profiler.profile(**options)`` without the lines its tracing library (kineto) prints on
    stderr at each start and stop (``USDT: ... profiler_start``): our commands print only their own
    progress and errors. A ``KINETO_LOG_LEVEL`` the user set is kept; kineto reads it when a profile
    starts."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    return profile(**options)


#: Kernels whose FLOPs the profiler reports (forward recomputation shows up in them).
_FLOP_KERNELS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::conv2d",
                           "aten::matmul", "aten::linear"})


@dataclass(frozen=True)
class MemoryTrace:
    """One profiled step.

    Attributes:
        peak_bytes: ``baseline_bytes`` plus the highest running sum of the
            allocator's events during the step.
        baseline_bytes: bytes alive before the step (parameters, buffers, inputs).
        end_bytes: live bytes when the step ended (baseline, parameter grads...).
        times_s: time of each point of the timeline, from the step's start.
        live_bytes: live bytes at each point (downsampled, peaks kept).
        kernel_flops: FLOPs of matmul/conv kernels the profiler saw.
    """

    peak_bytes: int
    baseline_bytes: int
    end_bytes: int
    times_s: tuple[float, ...]
    live_bytes: tuple[int, ...]
    kernel_flops: int


def profile_step(step: Callable[[], None], *, baseline_bytes: int, points: int = 400) -> MemoryTrace:
    """Run ``step`` once under the profiler and rebuild its memory timeline.

    Args:
        step: runs forward and backward; gradients must already be cleared
            (frees of tensors alive before the step would hide allocations).
        baseline_bytes: bytes alive before the step (``scheduler.measuring.storages.live_bytes_of``).
        points: at most this many timeline points are kept (maxima per bin).

    Returns:
        The :class:`MemoryTrace` of the step.
    """
    collecting = gc.isenabled()  # NOTE [ Measuring with profiler events ]: nothing from before freed in the step
    gc.disable()
    try:
        with quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_flops=True) as prof:
            step()
    finally:
        if collecting:
            gc.enable()
    events = prof.profiler.kineto_results.events()
    mem = sorted(((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"), key=lambda p: p[0])
    flops = sum(e.flops() for e in events if e.name() in _FLOP_KERNELS and e.flops())
    if not mem:
        return MemoryTrace(baseline_bytes, baseline_bytes, baseline_bytes, (0.0,), (baseline_bytes,), flops)
    t0 = mem[0][0]
    run = 0
    peak = 0
    times, live = [], []
    for t, nb in mem:
        run += nb
        peak = max(peak, run)
        times.append((t - t0) * 1e-9)
        live.append(baseline_bytes + run)
    times_d, live_d = downsample(times, live, points)
    return MemoryTrace(baseline_bytes + peak, baseline_bytes, baseline_bytes + run, times_d, live_d, flops)


def downsample(xs: Sequence[float], ys: Sequence[int], points: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """At most ``points`` pairs: the maximum of ``ys`` in each of equal bins of the sequence."""
    n = len(xs)
    if n <= points:
        return tuple(xs), tuple(ys)
    out_x, out_y = [], []
    for b in range(points):
        lo, hi = b * n // points, (b + 1) * n // points
        k = max(range(lo, hi), key=lambda i: ys[i])
        out_x.append(xs[k])
        out_y.append(ys[k])
    return tuple(out_x), tuple(out_y)
