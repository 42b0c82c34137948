"""Counting what the selective modes of ``scheduler.applying.selective`` ran, kept and served.

NOTE [ Counting what a selective policy served ]
    The profiler is no witness of what re-ran: its event for an ATen call
    opens in the dispatcher, with the call's FLOPs, before our dispatch
    modes or checkpoint's early stop decide anything. A kept call the
    recompute *serves* from the store (nothing runs) still shows as a
    kernel; a call our modes run again (``func(*args)`` inside
    ``__torch_dispatch__``) shows twice; the call at which torch's
    checkpoint stops its recompute (its last needed tensor saved again)
    shows although it never ran. Counted so, a plan keeping both matrix
    products of a region measured more recompute than a plain checkpoint of
    it (``compare_summary.md``: 59 % "measured" for a plan predicted at
    13 %). So the recomputed FLOPs of an eager step are counted below every
    mode of ours: a ``FlopCounterMode`` open around the whole step sees a
    call only when it reaches the kernels (not a served call, not the
    stopped one, a re-dispatched one once), and the step's count less the
    plain step's is what re-ran (``count_step_flops``).
    The modes themselves count what they decide while a :func:`tally` is
    open: calls made in the forward and kept, calls served and calls run
    again in the recompute, with the FLOPs of each (torch's formulas); the
    comparison reports them beside the count. A closed tally costs the
    modes one list test per call.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

__all__ = ["Tally", "tally", "count_step_flops"]

def _flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one call by torch's own formulas (0 for an op they do not price)."""
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func._overloadpacket)
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not fit these arguments: counted as no FLOPs
        return 0

class Tally:
    """What the selective modes saw while it was open (NOTE [ Counting what a selective policy served ]).

    Attributes:
        forward_calls: calls counted in regions' forwards.
        kept_calls: of those, the ones kept for the recompute.
        served_calls: recompute calls answered from the store (nothing ran).
        recomputed_calls: recompute calls that ran again.
        served_flops: FLOPs of the served calls (torch's formulas).
        recomputed_flops: FLOPs of the calls that ran again under a policy.
    """

    def __init__(self) -> None:
        self.forward_calls = self.kept_calls = self.served_calls = self.recomputed_calls = 0
        self.served_flops = self.recomputed_flops = 0

    def note(self, phase: str, func: Any, args: tuple, kwargs: dict, out: Any, *, kept: bool = False) -> None:
        if phase == "forward":
            self.forward_calls += 1
            self.kept_calls += int(kept)
        elif phase == "served":
            self.served_calls += 1
            self.served_flops += _flops(func, args, kwargs, out)
        else:
            self.recomputed_calls += 1
            self.recomputed_flops += _flops(func, args, kwargs, out)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))

_TALLIES: list[Tally] = []

@contextlib.contextmanager
def tally():  # noqa: ANN201
    """Count what the selective modes run, keep and serve while open (yields a :class:`Tally`)."""
    t = Tally()
    _TALLIES.append(t)
    try:
        yield t
    finally:
        _TALLIES.remove(t)

def _note(phase: str, func: Any, args: tuple, kwargs: dict, out: Any, kept: bool = False) -> None:
    for t in _TALLIES:
        t.note(phase, func, args, kwargs, out, kept=kept)

def count_step_flops(step: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """FLOPs of the kernels one eager ``step`` really ran, and what the selective modes served.

    NOTE [ Counting what a selective policy served ] (above):
    a ``FlopCounterMode`` around the step counts each call that reaches the
    kernels once (a kept call served from the store, or the call at which a
    checkpoint stops its recompute, not at all), where the profiler counts
    every call it sees enter the dispatcher. Returns ``(flops, tally)``,
    ``tally`` the selective modes' counts (:class:`Tally`).
    """
    from torch.utils.flop_counter import FlopCounterMode

    with tally() as seen, FlopCounterMode(display=False) as fc:
        step()
    return int(fc.get_total_flops()), seen.as_dict()
