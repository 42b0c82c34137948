"""Op classes the CPU roofline misprices, timed at the traced shapes.

NOTE [ Measured op classes ]
    The roofline (NOTE [ Roofline costs ] in ``scheduler.tracing.roofline``)
    prices a kernel by its FLOPs and bytes at the machine's peaks. On this
    project's CPU (one thread) convolutions are far from that and not by one
    factor: a 3x3 convolution of 8x16x96x96 took 2.5x its roofline time, of
    8x32x48x48 0.8x (oneDNN's kernels suit some channel counts and not
    others); max pooling took 4.3-4.6x at every shape tried. ResNet's plan
    was predicted to recompute 8.4 ms where it measured 13-20 ms
    (``benchmarks/results/time.md``), ``costs="time"`` 12.4 ms. So a trace
    for the CPU with roofline costs times the forward calls of
    :data:`~scheduler.tracing.roofline.OP_CLASSES` at their own shapes: the
    workspace probe (NOTE [ Op workspaces ] in
    ``scheduler.tracing.workspaces``) already notes every such call by its
    signature and builds it on real tensors, so each distinct signature is
    run :data:`REPEATS` more times and its least time kept (by the thread's
    CPU time at one torch thread, the cyclic collector held off: a Llama's
    predicted block recompute came out at 15.3-22.1 ms over five traces by
    the wall clock and three runs, 15.0-15.6 so); a node's kernels
    of a timed class are priced at the sum of its calls' times instead of
    their roofline (``OpRecord.class_times``). Other classes keep the
    roofline (memory-bound elementwise ops came out both above and below it,
    0.2-0.9x, by whether their tensors stay in cache: no one answer).

    Matrix products are a class too (``matmul``: ``mm``, ``addmm``, ``bmm``,
    ``baddbmm``): the peak FLOP/s is measured on a large square product, and
    a vocabulary head's ``[256, 256] @ [256, 32000]`` runs at 75 GFLOP/s
    where that peak is 92-96. Each timed run starts with cold caches
    (:class:`CacheFlush` writes twice the largest CPU cache before it): an op
    recomputed in the backward reads its weights and inputs from memory, the
    step in between having evicted them, and a warm loop's least time is
    below that. A 256 x 256 x 256 ``addmm`` took 0.37 ms warm and 0.50 ms
    cold, 256 x 256 x 768 1.08 and 1.35 ms; with products and cold caches the
    predicted forward of the time page's models (one thread) came within
    0.84-1.09x of their measured forward, where it had been 1.04-1.7x
    below it (Llama 76 ms predicted, 85-130 measured).

    Which classes are timed is read from ``op_classes.json`` in the
    calibration folder (``{"classes": [...]}``; absent: all of
    :data:`~scheduler.tracing.roofline.OP_CLASSES`), so the test suite pins
    none (no test reads the clock: ``tests/conftest.py``) and tests of the
    timing inject their own clock. A trace for a GPU, or with
    ``workspaces="none"``, times nothing (the probe does not run).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator

from graphs.reading import no_collection as held_off

from .calibration import cache_dir
from .roofline import OP_CLASSES, op_class

__all__ = ["REPEATS", "CacheFlush", "no_collection", "run_clock", "timed_classes", "time_calls"]

log = logging.getLogger(__name__)

_FILE = "op_classes.json"
#: Timed runs of each distinct call after the probe's own two (the least is kept).
REPEATS = 5


def timed_classes(cache: str | os.PathLike | None = None) -> tuple[str, ...]:
    """The classes a CPU trace times: ``op_classes.json``'s list in the calibration folder, else all."""
    path = os.path.join(cache_dir(cache), _FILE)
    if not os.path.exists(path):
        return OP_CLASSES
    try:
        with open(path, encoding="utf-8") as fh:
            got = json.load(fh)["classes"]
        return tuple(c for c in OP_CLASSES if c in got)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("op classes file %s is unreadable (%s); timing every class", path, exc)
        return OP_CLASSES


def _largest_cache_bytes() -> int | None:
    """The largest CPU cache of this machine (Linux's sysfs), or None where it does not say."""
    sizes = []
    folder = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(folder):
            with open(os.path.join(folder, entry, "size"), encoding="utf-8") as fh:
                text = fh.read().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
    except (OSError, ValueError):
        return None
    return max(sizes) if sizes else None


class CacheFlush:
    """Called before a timed run, it writes twice the largest CPU cache (64 MiB where unknown; at most 1 GiB), so
    that the run starts with cold caches, as an op recomputed in a step's backward does (NOTE [ Measured op
    classes ])."""

    def __init__(self, nbytes: int | None = None) -> None:
        largest = _largest_cache_bytes()
        self.nbytes = int(nbytes or min(1 << 30, max(64 << 20, 2 * largest) if largest else 64 << 20))
        self._junk: Any = None

    def __call__(self) -> None:
        import torch

        if self._junk is None:
            self._junk = torch.zeros(self.nbytes // 4)
        self._junk.add_(1.0)


def run_clock() -> Callable[[], float]:
    """The clock a run is timed by: this thread's CPU time where torch computes on one thread (it does not move
    while the machine's other work holds the core), else the wall clock."""
    import torch

    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic collector run once and then held off while timed runs run (as it was after).

    A collection set off inside a timed step walks every object the process holds (after a trace, the graphs):
    a GPT-2 or Llama step of 200 ms at one thread, timed in the trace's rounds, measured 199-244 ms with it and
    197-222 ms without, and the recompute its blocks add 7.8-16.9 ms over four traces against 16.7-19.0
    (NOTE [ Recompute timed in the step ] in ``scheduler.tracing.recompute_scale``)."""
    gc.collect()
    with held_off():
        yield


def time_calls(probe: Any, sigs: Iterable[tuple], classes: Iterable[str], device: Any,
               clock: Callable[[], float] | None = None, repeats: int = REPEATS,
               flush: Callable[[], None] | None = None) -> dict[tuple, float]:
    """The least time of each distinct signature of ``classes`` among ``sigs``, built by ``probe``
    (a :class:`~scheduler.tracing.workspaces.WorkspaceProbe`) on ``device``; a call that cannot be built is
    left out (priced by the roofline). ``flush`` runs before each timed run (default: a :class:`CacheFlush` on the
    CPU); ``clock`` times them (default: this thread's CPU time where torch computes on one thread, else the
    wall clock), with the collector held off (:func:`no_collection`)."""
    import torch

    wanted = set(classes)
    todo = [s for s in dict.fromkeys(sigs) if op_class(s[0][0]) in wanted]
    out: dict[tuple, float] = {}
    if not todo:
        return out
    if flush is None:
        flush = CacheFlush() if torch.device(device).type == "cpu" else (lambda: None)
    clock = clock or run_clock()
    with torch.no_grad(), torch.random.fork_rng(devices=[]), no_collection():
        for sig in todo:
            call = probe._call(sig, device)  # built and run once (warm)
            if call is None:
                continue
            best = math.inf
            for _ in range(repeats):
                flush()
                t0 = clock()
                call()
                best = min(best, clock() - t0)
            if math.isfinite(best) and best >= 0:
                out[sig] = best
    log.info("timed %d distinct call(s) of %s at their shapes: %.3g ms", len(out), ", ".join(sorted(wanted)),
             1e3 * sum(out.values()))
    return out
