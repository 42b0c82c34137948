"""This machine's CPU peaks for the roofline: measured, checked, stored per machine and thread count; and
:func:`device_peaks`, the peaks of a named device (the table's in ``scheduler.tracing.roofline``, or this CPU's).

NOTE [ CPU calibration ]
    A trace for the CPU is priced with this machine's peaks (NOTE [ Roofline
    costs ] in ``scheduler.tracing.roofline``): matmul FLOP/s per dtype, copy
    bandwidth, the bandwidth of each slow elementwise class (NOTE [ Slow
    elementwise kernels ] there), random draws per second, the fixed cost of
    one small op. They
    are measured once and stored, so one bad measurement is every later
    trace's price. Measured under contention (other processes on the cores;
    with several threads one descheduled worker stalls every matmul at its
    barrier) they can be off by orders of magnitude: a stored entry had
    2-thread bf16 matmuls at 1.4 GFLOP/s against 163.5 on one thread, and a
    trace priced with it predicted a 1,380 s forward for a model whose whole
    trace took 241 s. So:

    * best of rounds: :func:`calibrate` measures ``rounds`` times (each
      figure within a round is already the best of a few timed calls) and
      keeps each figure's best (the highest rate, the lowest overhead);
    * checked against one thread: with N > 1 threads the rounds alternate
      with rounds at one thread. N threads run the same kernels with more
      workers, so a figure below its one-thread value was measured while
      the machine was busy: it is raised to the one-thread value, and when
      it was below half of it the entry is marked ``contended`` (a warning
      says so, and ``ckpt calibrate`` on an idle machine measures again);
    * stored per machine and thread count with its date: the cache file
      (``cpu_peaks.json`` in :func:`cache_dir`) maps ``host | CPU model |
      torch version | N threads | vK`` to the figures, the one-thread
      figures, ``contended`` and ``measured_at`` (so machines sharing a home
      folder keep their own entries, and another torch or thread count
      measures afresh); the source shown with a trace's costs names the key
      and the date;
    * refreshable: ``ckpt calibrate`` measures again (``--threads``,
      ``--rounds``) and ``ckpt calibrate --show`` lists what is stored;
    * checked once per process: a stored entry can itself be a busy
      machine's (one on this project's machines had a copy bandwidth of
      3.9 GB/s where an idle measurement gives 16-26, and priced every
      elementwise op and the chunk loop's weight-gradient sums 4-6x too
      high: a ViT's recompute predicted +47 %, a chunked head's cost 25 ms
      against 4 measured). The first use of a stored entry in a process runs
      a spot check (:func:`spot_cpu`: a 64 MiB copy and a float32 matmul,
      best of a few, about 0.1 s); interference only lowers a rate, so a
      stored rate below :data:`STALE_BELOW` of the spot check's was measured
      while the machine was busy, and the entry is measured again (a
      warning names the figures) and stored with each rate the best of old
      and new. An entry marked ``pinned`` (the test suite's fixed figures)
      is never checked.

    The measuring function is a parameter (``measure``): tests pass one that
    returns figures, so none of them reads the clock.
    ``tests/scheduler/tracing/test_calibration.py``.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from graphs import CkptError
from graphs.files import write_text_atomic

from .roofline import DEVICES, DevicePeaks, UnknownDevice, lookup_device

if TYPE_CHECKING:
    import torch

__all__ = ["CACHE_ENV", "Calibration", "MeasureFn", "cache_dir", "measure_cpu", "spot_cpu", "calibrate", "cpu_peaks",
           "device_peaks", "stored_calibrations", "cache_key"]

log = logging.getLogger(__name__)

#: Environment variable overriding the cache folder of the measured CPU peaks.
CACHE_ENV = "CKPT_CACHE_DIR"
_CACHE_FILE = "cpu_peaks.json"
_VERSION = 5  # part of the cache key: entries of an older calibration are measured again
_RATES = ("bytes_per_s", "random_per_s")  # with each entry of the _GROUPS: higher is better
_GROUPS = ("flops_per_s", "class_bytes_per_s")  # figures by dtype, by kernel class
#: A figure this far below its one-thread value marks the entry ``contended``.
CONTENDED_BELOW = 0.5
#: A stored rate this far below the spot check's marks the entry as measured on a busy machine: measured again.
STALE_BELOW = 0.5
#: ``(cache file, key)`` of the entries spot-checked in this process (NOTE [ CPU calibration ]).
_CHECKED: set[tuple[str, str]] = set()

#: ``measure(threads) -> figures`` (``flops_per_s`` by dtype, ``bytes_per_s``, ``op_overhead_s``, ``random_per_s``).
MeasureFn = Callable[[int], Mapping[str, Any]]


def cache_dir(cache: str | os.PathLike | None = None) -> str:
    """Where the measured CPU peaks are stored: ``cache``, else ``$CKPT_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/ckpt``, else ``~/.cache/ckpt``."""
    if cache is not None:
        return os.fspath(cache)
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckpt")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def cache_key(threads: int) -> str:
    """The stored entry's key: this machine, its CPU model, torch's version and ``threads``."""
    import torch

    return f"{platform.node() or 'host'} | {_cpu_model()} | torch {torch.__version__} | {threads} threads | v{_VERSION}"


def _best_s(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _matmul_rate(dtype: str, n: int, repeats: int) -> float:
    """FLOP/s of an ``n x n`` matmul in ``dtype``, best of ``repeats``."""
    import torch

    a, b = (torch.randn(n, n).to(getattr(torch, dtype)) for _ in range(2))
    return 2 * n ** 3 / _best_s(lambda: torch.mm(a, b), repeats)


def _copy_rate(repeats: int) -> float:
    """Bytes read plus written per second of a 64 MiB float32 copy (beyond the caches), best of ``repeats``."""
    import torch

    src = torch.ones(16 << 20)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / _best_s(lambda: dst.copy_(src), repeats)


def measure_cpu(threads: int) -> dict[str, Any]:
    """One measurement of this CPU at ``threads`` threads (about a second): matmuls, a copy, draws, a tiny op.

    The copy (64 MiB each way) is larger than the caches. The tiny op is a
    module call on four elements with autograd recording, as a recompute
    runs it: what eager PyTorch spends per op beyond the work. Torch's
    thread count is restored afterwards.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = {dtype: _matmul_rate(dtype, n, 3) for dtype, n in (("float32", 512), ("bfloat16", 256),
                                                                     ("float16", 256))}
        bandwidth = _copy_rate(5)
        draws = torch.empty(1 << 20)
        # At dropout's usual keep probability: on a CPU a draw near 0.5 takes twice as long (branches).
        random_per_s = draws.numel() / _best_s(lambda: draws.bernoulli_(0.9), 3)
        classes = _class_rates(torch.randn(4 << 10, 1024))  # 16 MiB: a 64 MiB output is faulted in at every call
        x = torch.ones(4, requires_grad=True)
        relu = torch.nn.ReLU()
        calls = 200

        def tiny() -> None:
            for _ in range(calls):
                relu(x)

        overhead = _best_s(tiny, 3) / calls
    finally:
        torch.set_num_threads(before)
    return {"flops_per_s": flops, "bytes_per_s": bandwidth, "op_overhead_s": overhead, "random_per_s": random_per_s,
            "class_bytes_per_s": classes}


def _class_rates(x: torch.Tensor) -> dict[str, float]:
    """Bytes read plus written per second of one call of each class of ``SLOW_CLASSES`` on ``x`` (rows of
    float32; NOTE [ Slow elementwise kernels ] in ``scheduler.tracing.roofline``), best of 3."""
    import torch
    import torch.nn.functional as F

    cols = x.shape[-1]
    w, b = torch.ones(cols), torch.zeros(cols)
    mask = torch.rand(1, cols) < 0.5
    calls: dict[str, Callable[[], Any]] = {
        "gelu": lambda: F.gelu(x), "gelu_tanh": lambda: F.gelu(x, approximate="tanh"), "silu": lambda: F.silu(x),
        "tanh": lambda: torch.tanh(x), "sigmoid": lambda: torch.sigmoid(x), "exp": lambda: torch.exp(x),
        "erf": lambda: torch.erf(x), "masked_fill": lambda: x.masked_fill(mask, 0.0),
        "softmax": lambda: torch.softmax(x, -1), "log_softmax": lambda: torch.log_softmax(x, -1),
        "layer_norm": lambda: F.layer_norm(x, (cols,), w, b),
    }
    moved = 2 * x.numel() * x.element_size()
    return {name: moved / _best_s(fn, 3) for name, fn in calls.items()}


def spot_cpu(threads: int) -> dict[str, Any]:
    """A quick check of a stored entry (about 0.1 s): float32 matmul FLOP/s and copy bandwidth, as
    :func:`measure_cpu` measures them, each the best of a few calls (NOTE [ CPU calibration ])."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops, bandwidth = _matmul_rate("float32", 512, 5), _copy_rate(5)
    finally:
        torch.set_num_threads(before)
    return {"flops_per_s": {"float32": flops}, "bytes_per_s": bandwidth}


def _stale(entry: Mapping[str, Any], spot: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """The rates of ``entry`` below :data:`STALE_BELOW` of the spot check's: ``name -> (stored, spot)``."""
    stored = _rates(entry["figures"])
    now = {f"flops_per_s.{k}": float(v) for k, v in dict(spot.get("flops_per_s") or {}).items()}
    now.update({k: float(spot[k]) for k in _RATES if spot.get(k) is not None})
    return {k: (stored[k], v) for k, v in now.items() if k in stored and stored[k] < STALE_BELOW * v}


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` found (NOTE [ CPU calibration ]).

    Attributes:
        threads: the thread count measured for.
        figures: the figures used (best of the rounds, raised to the one-thread figures).
        measured: the best of the N-thread rounds, as measured.
        one_thread: the best of the one-thread rounds (``measured`` itself when ``threads`` is 1).
        contended: names of the figures measured below :data:`CONTENDED_BELOW` of their one-thread value.
        rounds: rounds at each thread count.
    """

    threads: int
    figures: Mapping[str, Any]
    measured: Mapping[str, Any]
    one_thread: Mapping[str, Any]
    contended: tuple[str, ...] = ()
    rounds: int = 1
    measured_at: str = field(default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds"))


def _rates(fig: Mapping[str, Any]) -> dict[str, float]:
    """Every higher-is-better figure by name (``flops_per_s.bfloat16``, ``bytes_per_s``,
    ``class_bytes_per_s.gelu``...)."""
    out = {f"{group}.{k}": float(v) for group in _GROUPS for k, v in dict(fig.get(group) or {}).items()}
    out.update({k: float(fig[k]) for k in _RATES if fig.get(k) is not None})
    return out


def _figures(rates: Mapping[str, float], overhead_s: float) -> dict[str, Any]:
    groups = {g: {k.split(".", 1)[1]: v for k, v in rates.items() if k.startswith(f"{g}.")} for g in _GROUPS}
    return {**groups, "op_overhead_s": overhead_s, **{k: rates[k] for k in _RATES if k in rates}}


def _best(rounds: list[Mapping[str, Any]]) -> dict[str, Any]:
    rates: dict[str, float] = {}
    for fig in rounds:
        for k, v in _rates(fig).items():
            rates[k] = max(rates.get(k, 0.0), v)
    return _figures(rates, min(float(f["op_overhead_s"]) for f in rounds))


def calibrate(threads: int | None = None, *, rounds: int = 3, measure: MeasureFn | None = None) -> Calibration:
    """Measure this CPU at ``threads`` (default: torch's), robust to a busy machine (NOTE [ CPU calibration ]).

    Args:
        threads: torch's intra-op thread count to measure for.
        rounds: measurements at each thread count (alternating N threads and one).
        measure: ``measure(threads) -> figures`` (default :func:`measure_cpu`).
    """
    import torch

    threads = int(threads or torch.get_num_threads())
    if threads < 1 or rounds < 1:
        raise CkptError(f"calibrate needs threads >= 1 and rounds >= 1, got threads={threads}, rounds={rounds}")
    measure = measure or measure_cpu
    many: list[Mapping[str, Any]] = []
    one: list[Mapping[str, Any]] = []
    for _ in range(rounds):
        many.append(measure(threads))
        if threads > 1:
            one.append(measure(1))
    measured = _best(many)
    single = _best(one) if one else measured
    rates, floor = _rates(measured), _rates(single)
    contended = tuple(sorted(k for k, v in rates.items() if k in floor and v < CONTENDED_BELOW * floor[k]))
    overhead_s = min(float(measured["op_overhead_s"]), float(single["op_overhead_s"]))
    used = _figures({k: max(v, floor.get(k, 0.0)) for k, v in rates.items()}, overhead_s)
    if contended:
        log.warning("CPU calibration at %d threads ran on a busy machine: %s measured below half the one-thread "
                    "figure (used the one-thread figure); run `ckpt calibrate` on an idle machine", threads,
                    ", ".join(contended))
    return Calibration(threads, used, measured, single, contended, rounds)


def _read(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh)
        if not isinstance(entries, dict):
            raise ValueError("not a JSON object")
        return entries
    except (OSError, ValueError) as exc:
        log.warning("CPU peaks cache %s is unreadable (%s); measuring again", path, exc)
        return {}


def _peaks(name: str, key: str, entry: Mapping[str, Any]) -> DevicePeaks:
    return DevicePeaks.from_dict({**entry["figures"], "name": name,
                                  "source": f"measured on this machine ({key}) on {entry['measured_at']}"})


def stored_calibrations(cache: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The stored entries (key -> entry), as :func:`cpu_peaks` wrote them."""
    return _read(os.path.join(cache_dir(cache), _CACHE_FILE))


def cpu_peaks(*, cache: str | os.PathLike | None = None, refresh: bool = False, threads: int | None = None,
              rounds: int = 2, measure: MeasureFn | None = None, check: MeasureFn | None = None) -> DevicePeaks:
    """This machine's CPU peaks at ``threads`` (default torch's): the stored entry, else calibrated and stored.

    A missing, corrupt or unreadable entry is measured again and written
    atomically; a cache that cannot be written only logs a warning.

    Args:
        cache: the cache folder (default: :func:`cache_dir`).
        refresh: measure even when an entry is stored (``ckpt calibrate``).
        threads, rounds, measure: as :func:`calibrate` (two rounds when a trace
            calibrates on first use; ``ckpt calibrate`` takes three).
        check: the spot check of a stored entry, once per process (default
            :func:`spot_cpu`; NOTE [ CPU calibration ]).
    """
    import torch

    threads = int(threads or torch.get_num_threads())
    folder = cache_dir(cache)
    path = os.path.join(folder, _CACHE_FILE)
    key = cache_key(threads)
    name = f"cpu ({_cpu_model()}, {threads} threads)"
    entries = _read(path)
    old = None
    if not refresh and key in entries:
        try:
            peaks = _peaks(name, key, entries[key])
        except (TypeError, ValueError, KeyError) as exc:
            log.warning("CPU peaks cache %s has a malformed entry (%s); measuring again", path, exc)
        else:
            if entries[key].get("pinned") or (path, key) in _CHECKED:
                return peaks
            _CHECKED.add((path, key))
            stale = _stale(entries[key], (check or spot_cpu)(threads))
            if not stale:
                return peaks
            log.warning("the stored CPU peaks (%s, %s) were measured on a busy machine: %s; measuring again",
                        key, entries[key].get("measured_at"),
                        ", ".join(f"{k} {a:.3g} stored, {b:.3g} now" for k, (a, b) in sorted(stale.items())))
            old = entries[key]["figures"]
    cal = calibrate(threads, rounds=rounds, measure=measure)
    figures = cal.figures
    if old is not None:  # interference only lowers a rate: each the best of the stored and the new
        rates = _rates(old)
        rates.update({k: max(v, rates.get(k, 0.0)) for k, v in _rates(figures).items()})
        figures = _figures(rates, min(float(old["op_overhead_s"]), float(figures["op_overhead_s"])))
    _CHECKED.add((path, key))
    entries[key] = {"figures": figures, "measured": cal.measured, "one_thread": cal.one_thread,
                    "contended": list(cal.contended), "rounds": cal.rounds, "measured_at": cal.measured_at}
    peaks = _peaks(name, key, entries[key])  # checks the figures before they are stored
    try:
        os.makedirs(folder, exist_ok=True)
        write_text_atomic(path, json.dumps(entries, indent=1, sort_keys=True) + "\n")
    except (OSError, CkptError) as exc:
        log.warning("could not store the CPU peaks in %s: %s", path, exc)
    log.info("measured %s: %.3g float32 FLOP/s, %.3g B/s, %.2g s per op", name, peaks.peak("float32"),
             peaks.bytes_per_s, peaks.op_overhead_s)
    return peaks


def device_peaks(name: str, *, cache: str | os.PathLike | None = None) -> DevicePeaks:
    """The peaks of a named device: a table name, or ``cpu`` (this machine's CPU, measured).

    Raises:
        UnknownDevice: the name is neither, naming the table's devices.
    """
    if name.strip().lower() == "cpu":
        return cpu_peaks(cache=cache)
    peaks = lookup_device(name)
    if peaks is None:
        raise UnknownDevice(f"no peaks known for device {name!r}; known devices: {', '.join(DEVICES)}, or cpu "
                            "(this machine's CPU, measured)")
    return peaks
