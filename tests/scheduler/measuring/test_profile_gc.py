"""``profile_step``'s peak does not move with the garbage collector (NOTE [ Measuring with profiler events ] in
``scheduler.measuring.profiler``).

Issue 33: the 4-stage GPipe's first stage measured 1,342,720 B in some runs and 1,054,976 B in others: a collection
during its step freed reference cycles left by the earlier runs in the same process, tensors among them, and each
such free lowered the running sum the peak is read from.
"""

from __future__ import annotations

import gc

import torch

from scheduler.measuring.profiler import profile_step

MB = 1 << 20


class _Cycle:
    def __init__(self) -> None:
        self.me = self
        self.tensor = torch.ones(MB // 4)  # 1 MiB, freed only when a collection finds the cycle


def test_garbage_of_an_earlier_step_is_not_freed_inside_the_next_one():
    """As in the pipeline runs: an earlier measured step left a reference cycle holding a tensor it made (the
    profiler knows its size, so its free is an event), and a collection during the next measured step freed it."""
    left = []

    def earlier() -> None:  # makes the cycle under the profiler, then lets go of it: garbage, not yet collected
        gc.disable()
        left.append(_Cycle())
        left.clear()

    def step() -> None:
        junk = [[] for _ in range(5000)]  # enough new containers to set off a collection, were the collector on
        x = torch.ones(MB)  # 4 MiB: the step's peak
        del junk, x

    peaks = []
    for _ in range(2):
        try:
            profile_step(earlier, baseline_bytes=0)
        finally:
            gc.enable()
        peaks.append(profile_step(step, baseline_bytes=0).peak_bytes)
    assert peaks == [4 * MB] * 2  # was 3 MiB: the earlier step's tensor freed inside this one, 1 MiB off the sum
    assert gc.isenabled()


def test_the_collector_is_off_during_the_step_and_back_after():
    seen = []
    profile_step(lambda: seen.append(gc.isenabled()), baseline_bytes=0)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        profile_step(lambda: None, baseline_bytes=0)
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
