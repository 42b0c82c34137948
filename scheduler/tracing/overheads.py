"""What a plan's own machinery costs on this machine: measured, stored like the CPU peaks; a table for GPUs.

NOTE [ Overhead calibration ]
    The figures NOTE [ Plan overheads ] (``solvers.model.overheads``) prices
    a plan with are measured here for the CPU, once per machine, CPU model,
    torch version and thread count, and stored beside the CPU peaks
    (``plan_overheads.json`` in ``calibration.cache_dir``, the same key as
    NOTE [ CPU calibration ]), with their date:

    * ``op_s``: a small op's forward and backward (a chain of ReLUs on four
      elements, per op);
    * ``region_s``: a ``checkpoint(..., use_reentrant=False,
      preserve_rng_state=False)`` call of one small op, forward and backward,
      less the same op without it and less the op's recompute;
    * ``random_region_s``: the same call with ``preserve_rng_state=True``
      less without;
    * ``selective_op_s``: per call, a region of small ops run under a
      selective policy less the plain region, over its calls in the forward
      and the recompute; ``kept_call_s``: per kept call, keeping most calls
      less keeping one. Measured with torch's own selective checkpoint
      (``create_selective_checkpoint_contexts``), whose two dispatch modes
      do what ours do per call (NOTE [ Selective checkpoint policies ] in
      ``scheduler.applying.selective``: tracing does not import the
      applier);
    * ``chunk_s``: the chunk loop's own work per extra chunk (slicing rows,
      joining the outputs), beyond the ops it runs;
    * ``recompute_op_s``: per op, a region of small ops (forward and
      backward) less the plain ops, less their forward run again and less
      ``region_s``: the hooks and graph a recompute adds to each kernel
      (an entry stored before this figure is measured again);
    * ``gemm_rows``: float32 FLOP/s of a head's three products at several
      row counts (products at a chunk's smaller shape): the forward
      ``[rows, 256] @ [256, 16384]``, the input gradient
      ``[rows, 16384] @ [16384, 256]`` and the weight gradient
      ``[256, rows] @ [rows, 16384]``, their FLOPs over their summed time,
      which is what the chunk term multiplies (a call's forward and
      backward FLOPs). The weights are larger than the caches, as a
      vocabulary head's are: with 1,024 columns (an earlier table) the rate
      did not fall with fewer rows and the chunk loop's products were priced
      at nothing, where a 32,000-word head's forward runs at 79 GFLOP/s
      over 256 rows, 70 over 128 and 52 over 64 (a head in 4 chunks
      measured 60-75 ms more per step than in one). The counts are
      powers of two from 16 to 512 (a chunk of more rows is priced at 512's
      rate; 1,024 measured no faster and took 3 s): with only 16, 64, 256
      and 1,024 (the
      forward's alone, an earlier table) the rate at 128 rows, a 256-row
      head in 2 chunks, was read off the line from 64 to 256 (58 GFLOP/s)
      where the products run as fast as at 256 (66-73), and a head in 2
      chunks was priced 36.9 ms for 22.1 measured. An entry measured at another shape is measured again; one
      marked ``pinned`` (the tests' zero figures) is used as it is.

    As for the peaks, a busy machine can ruin a measurement, so each figure
    is the best of ``rounds`` that alternate N threads with one thread: the
    least time for ``op_s`` (overheads are Python and dispatch, not
    threads), the median for the figures that are differences of two times
    (the least of a difference is biased low: ``selective_op_s`` once came
    out 4.7 us, then 15.2 and 28), and the highest rate, a rate never below
    its one-thread value. The measuring
    function is a parameter, so tests never read the clock; the test suite
    pins figures of zero (``tests/conftest.py``), and tests of the terms
    inject their own on a graph (``solvers.model.overheads.with_overheads``).
    A trace for a named GPU takes :data:`GPU_OVERHEADS`, our stated
    estimates (no datasheet gives them): eager PyTorch's per-call costs are
    host-side Python and launches, so they are of the CPU that drives the
    GPU; no ``gemm_rows`` (no table: the term is 0 there).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import statistics
import time
from typing import Any, Callable, Mapping

from graphs import CkptError
from graphs.files import write_text_atomic
from solvers.model.overheads import Overheads

from .calibration import cache_dir, cache_key

__all__ = ["GPU_OVERHEADS", "OverheadMeasure", "measure_overheads", "calibrate_overheads", "cpu_overheads",
           "target_overheads"]

log = logging.getLogger(__name__)

_CACHE_FILE = "plan_overheads.json"
_ROWS = (16, 32, 64, 128, 256, 512)
#: The products of ``gemm_rows``: a head ``[rows, 256] @ [256, GEMM_COLS]``'s forward, input gradient and
#: weight gradient, weights (16 MiB) beyond the caches, as a vocabulary head's.
GEMM_COLS = 16384
#: What a stored ``gemm_rows`` was timed on: an entry timed on another table is measured again.
GEMM_TABLE = "head fwd+dX+dW, 256 x 16384, rows 16-512 in powers of two"
_TIMES = ("op_s", "region_s", "random_region_s", "selective_op_s", "kept_call_s", "chunk_s", "recompute_op_s")

#: ``measure(threads) -> figures`` (the names of :class:`~solvers.model.overheads.Overheads`).
OverheadMeasure = Callable[[int], Mapping[str, Any]]

#: A named GPU's overheads: our estimates (host-side; NOTE [ Overhead calibration ]).
GPU_OVERHEADS = Overheads(region_s=60e-6, random_region_s=20e-6, selective_op_s=4e-6, kept_call_s=2e-6,
                          chunk_s=40e-6, op_s=15e-6, source="estimates for eager PyTorch on a GPU "
                          "(scheduler.tracing.overheads.GPU_OVERHEADS)")


def _best_s(fn: Callable[[], Any], repeats: int = 5) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _head_rate(rows: int, width: int = 256, cols: int = GEMM_COLS) -> float:
    """``gemm_rows``' figure (NOTE [ Overhead calibration ]): FLOP/s of a head's forward, input- and weight-gradient products over
    ``rows`` rows, their FLOPs over the sum of their times (each the best of 3 after one warm-up call)."""
    import torch

    # constant operands: a product's time does not depend on its values, and drawing 32 MiB of random numbers
    # took longer than the products
    w = torch.full((width, cols), 0.01)
    x, g = torch.full((rows, width), 0.5), torch.full((rows, cols), 0.25)
    seconds = (_best_s(lambda: torch.mm(x, w), 3) + _best_s(lambda: torch.mm(g, w.t()), 3)
               + _best_s(lambda: torch.mm(x.t(), g), 3))
    return 3 * 2 * rows * width * cols / max(seconds, 1e-9)


def measure_overheads(threads: int) -> dict[str, Any]:
    """One measurement of the figures at ``threads`` threads (a second or two; NOTE [ Overhead calibration ])."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(4, requires_grad=True)
        n = 32

        def chain(t: torch.Tensor, ops: int = n) -> torch.Tensor:
            for _ in range(ops):
                t = torch.relu(t)
            return t

        def step(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
            return lambda: fn().sum().backward()

        plain = _best_s(step(lambda: chain(x)))
        op_s = plain / n
        one = _best_s(step(lambda: chain(x, 1)))
        calls = 20

        def regions(**kw: Any) -> torch.Tensor:
            t = x
            for _ in range(calls):
                t = checkpoint(torch.relu, t, use_reentrant=False, **kw)
            return t.sum()

        def bare() -> torch.Tensor:
            t = x
            for _ in range(calls):
                t = torch.relu(t)
            return t.sum()

        t_bare = _best_s(lambda: bare().backward())
        t_region = _best_s(lambda: regions(preserve_rng_state=False).backward())
        t_random = _best_s(lambda: regions(preserve_rng_state=True).backward())
        region_s = max(0.0, (t_region - t_bare) / calls - one / 2)
        random_s = max(0.0, (t_random - t_region) / calls)

        def selective(keep: int) -> Callable[[], None]:
            def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
                seen[0] += 1
                return CheckpointPolicy.MUST_SAVE if seen[0] % n < keep else CheckpointPolicy.PREFER_RECOMPUTE
            seen = [0]

            def run() -> None:
                checkpoint(chain, x, use_reentrant=False,
                           context_fn=lambda: create_selective_checkpoint_contexts(policy)).sum().backward()
            return run

        t_plain_region = _best_s(lambda: checkpoint(chain, x, use_reentrant=False).sum().backward())

        def forward() -> None:
            with torch.enable_grad():
                chain(x)
        recompute_op_s = max(0.0, (t_plain_region - plain - _best_s(forward) - region_s) / n)
        t_keep1 = _best_s(selective(1))
        t_keep_most = _best_s(selective(n - 1))
        selective_op_s = max(0.0, (t_keep1 - t_plain_region) / (2 * n))
        kept_call_s = max(0.0, (t_keep_most - t_keep1) / (n - 2))

        rows = torch.ones(64, 4, requires_grad=True)

        def loop(k: int) -> Callable[[], None]:
            def run() -> None:
                torch.cat([torch.relu(part) for part in rows.split(64 // k)]).sum().backward()
            return run

        chunk_s = max(0.0, (_best_s(loop(8)) - _best_s(loop(1))) / 7 - op_s)
        gemm = [[m, _head_rate(m)] for m in _ROWS]
    finally:
        torch.set_num_threads(before)
    return {"op_s": op_s, "region_s": region_s, "random_region_s": random_s, "selective_op_s": selective_op_s,
            "kept_call_s": kept_call_s, "chunk_s": chunk_s, "recompute_op_s": recompute_op_s, "gemm_rows": gemm}


def _best(rounds: list[Mapping[str, Any]], floor: Mapping[int, float] | None = None) -> dict[str, Any]:
    # op_s is one time: its least; the others are differences of two times, whose least is biased low
    out: dict[str, Any] = {k: (min if k == "op_s" else statistics.median)([float(r.get(k, 0.0)) for r in rounds])
                           for k in _TIMES}
    rates: dict[int, float] = dict(floor or {})
    for r in rounds:
        for m, rate in r.get("gemm_rows", ()):
            rates[int(m)] = max(rates.get(int(m), 0.0), float(rate))
    out["gemm_rows"] = sorted([m, rate] for m, rate in rates.items())
    return out


def calibrate_overheads(threads: int | None = None, *, rounds: int = 3,
                        measure: OverheadMeasure | None = None) -> dict[str, Any]:
    """The figures at ``threads``, best of ``rounds`` alternated with one-thread rounds (NOTE [ Overhead
    calibration ]); also ``one_thread`` and ``measured_at``."""
    import torch

    threads = int(threads or torch.get_num_threads())
    if threads < 1 or rounds < 1:
        raise CkptError(f"calibrating overheads needs threads >= 1 and rounds >= 1, got {threads}, {rounds}")
    measure = measure or measure_overheads
    many, one = [], []
    for _ in range(rounds):
        many.append(measure(threads))
        if threads > 1:
            one.append(measure(1))
    single = _best(one) if one else None
    floor = {int(m): float(r) for m, r in single["gemm_rows"]} if single else None
    figures = _best(many + one, floor)  # op_s the least, differences the median; rates: never below one thread's
    Overheads.from_dict(figures)  # checks them
    figures["gemm_cols"] = GEMM_COLS
    figures["gemm_table"] = GEMM_TABLE
    return {"figures": figures, "one_thread": single, "rounds": rounds,
            "measured_at": datetime.datetime.now().isoformat(timespec="seconds")}


def cpu_overheads(*, cache: str | os.PathLike | None = None, refresh: bool = False, threads: int | None = None,
                  rounds: int = 2, measure: OverheadMeasure | None = None) -> Overheads:
    """This machine's overhead figures at ``threads``: the stored entry, else measured and stored."""
    import torch

    threads = int(threads or torch.get_num_threads())
    folder = cache_dir(cache)
    path = os.path.join(folder, _CACHE_FILE)
    key = cache_key(threads)
    entries: dict[str, Any] = {}
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as fh:
                entries = json.load(fh)
            if not isinstance(entries, dict):
                entries = {}
        except (OSError, ValueError) as exc:
            log.warning("plan overheads cache %s is unreadable (%s); measuring again", path, exc)
    stored = entries.get(key)
    if (not refresh and isinstance(stored, dict) and all(k in (stored.get("figures") or {}) for k in _TIMES)
            and (stored.get("pinned") or stored["figures"].get("gemm_table") == GEMM_TABLE)):
        try:
            e = entries[key]
            return Overheads.from_dict({**e["figures"], "source": f"measured on this machine ({key}) on "
                                        f"{e['measured_at']}"})
        except (TypeError, ValueError, KeyError) as exc:
            log.warning("plan overheads cache %s has a malformed entry (%s); measuring again", path, exc)
    entries[key] = calibrate_overheads(threads, rounds=rounds, measure=measure)
    try:
        os.makedirs(folder, exist_ok=True)
        write_text_atomic(path, json.dumps(entries, indent=1, sort_keys=True) + "\n")
    except (OSError, CkptError) as exc:
        log.warning("could not store the plan overheads in %s: %s", path, exc)
    return Overheads.from_dict({**entries[key]["figures"],
                                "source": f"measured on this machine ({key}) on {entries[key]['measured_at']}"})


def target_overheads(kind: str) -> Overheads:
    """The overheads a trace for a ``cpu`` or ``cuda`` target is priced with (NOTE [ Overhead calibration ])."""
    return cpu_overheads() if kind == "cpu" else GPU_OVERHEADS
