"""One wall-clock deadline for a whole solve, passed down to every phase.

NOTE [ One deadline ]
    ``time_limit_s`` is a promise about the wall clock: ``ilp``, ``frontier``
    and ``cp-sat`` return within the limit plus half a second, wherever the
    time goes (the frontier program, the warm-start solvers, completing the
    CP-SAT hint, CP-SAT itself, the least-peak search of an infeasible
    budget). The call makes one :class:`Deadline` and hands it down; each
    phase asks it what is left and takes at most that, and a phase that
    cannot be stopped once started (one warm-start solver, building the
    model) is not started once the deadline has passed. There are no
    per-phase floors: ``max(1.0, left)`` for each of three phases once made
    ``ilp(time_limit_s=1)`` run 4.1 s on a loaded machine.

    The clock only stops a search that runs too long; it does not decide
    the answer when the work limit binds first (NOTE [ Deterministic CP-SAT ]
    in ``solvers.ilp_cpsat``). Tests inject a fake ``clock`` to check that
    phases consult the deadline, without depending on the machine's speed.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["Deadline"]


class Deadline:
    """A point in time a solve must be back by.

    Args:
        limit_s: seconds from now.
        clock: a monotonic clock in seconds (default ``time.monotonic``;
            tests pass a fake one).
    """

    def __init__(self, limit_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = float(limit_s)
        self.clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        """Seconds since the deadline was made."""
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.limit_s - self.elapsed())

    def expired(self) -> bool:
        """Whether no time is left."""
        return self.left() <= 0.0

    def __repr__(self) -> str:
        return f"Deadline({self.limit_s:g} s, {self.left():.3g} s left)"
