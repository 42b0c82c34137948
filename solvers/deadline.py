"""One wall-clock deadline for a whole solve, passed down to every phase.

NOTE [ One deadline ]
    ``time_limit_s`` is a promise about the wall clock: ``ilp``, ``frontier``
    and ``cp-sat`` return within the limit plus a second, cold or warm (numba's
    kernel compiled or not), idle or loaded, with the best plan found and a
    status that says what was proven. The call makes one :class:`Deadline`
    and hands it down; every phase asks it what is left and takes at most
    that: the frontier programs, the warm starts (each candidate plan, ``dp``'s
    table as it fills: NOTE [ Bounded warm starts ] in ``solvers.warm``),
    numba's kernel (never waited for: NOTE [ The dp kernel under a deadline ]
    in ``solvers.dp.kernel``), building the CP-SAT model (it looks at the
    deadline as it goes), completing the CP-SAT hint, its knapsack cuts (row
    by row), CP-SAT itself, the least-peak search of an infeasible budget;
    and the read-out keeps back what one ``simulate`` of the plan takes
    (:meth:`Deadline.read_out_s`; ``solve`` then reuses that simulation).
    The CP-SAT phases also keep back freeing the model (collected before
    the answer, within the limit) and, for a search, the grace a search told
    to stop has before it is left running: it was told to stop at the
    deadline itself, and a 20,000-node chain's solve returned 1.6 s past
    60 s (NOTE [ What follows a search ] in ``solvers.cpsat.model``). A
    phase that is one pass over the graph and cannot stop halfway (a
    warm-start plan's simulation, building the frontier program, a knapsack
    cut) is not started when less than a pass is left: the
    solve times the graph's fingerprint (which the read-out needs anyway,
    about two passes) at the start, here and at this load (``pass_s``), and
    on a graph whose passes are a large part of the limit first probes the
    load (``probe_load``) and answers at once, without a plan, when the limit
    cannot hold the fingerprint, one plan and its read-out. There are no
    per-phase floors: ``max(1.0, left)`` for each of three phases once made
    ``ilp(time_limit_s=1)`` run 4.1 s on a loaded machine.

    A solve that makes several solves (``scheduler.solve`` with ``chunks=``,
    ``mlp_chunks=`` or ``nested=True``: one per chunk count, the nested
    candidates) keeps the caller's one limit: each solve it makes gets what
    is left of it, and one that stops without a plan (:func:`stopped`) leaves
    the others' answers standing; the answer then says ``feasible`` (the menu
    was not searched whole).

    The clock only stops a search that runs too long; what a search finds
    is decided by the work it counts (``work_limit``): CP-SAT's deterministic
    time (NOTE [ Deterministic CP-SAT ] in ``solvers.cpsat.solver``), the
    frontier program's work (NOTE [ The frontier program's work ] in
    ``solvers.frontier.program``) and the size of ``dp``'s table, so an answer whose
    searches all end within their work is the same on a busy machine. Tests
    inject a fake ``clock`` to check that phases consult the deadline, and
    small work limits, without depending on the machine's speed.

    ``ckpt solve --time-limit N`` keeps N for the whole command, not only the
    solver call: Python's start, the imports and reading the graph (about a
    second idle, more on a loaded machine: a 5 s limit once took 7.1-8.7 s
    at a load of 7-9) count against it. The command runs its solve under
    :func:`already_spent` with the seconds since the process started, and the
    first deadline the solve makes starts that much earlier (its
    ``limit_s``, the number the messages name, stays the user's); the
    deadlines made after it are each handed what is left, as above. The
    phases before the solve (reading the graph, the budget) check the same
    limit as they go, and the process ends without Python's teardown: NOTE
    [ The command's time limit ] in ``scheduler.commands.limits``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from typing import Callable, Iterator

from graphs import CkptError

__all__ = ["Deadline", "OutOfTime", "stopped", "already_spent", "spent_before", "process_age_s", "READ_OUT_S",
           "PASS_S_PER_NODE"]

#: Seconds spent before the solve that the next :class:`Deadline` made counts as gone (NOTE [ One deadline ]).
_SPENT: contextvars.ContextVar[float] = contextvars.ContextVar("ckpt_deadline_spent", default=0.0)

#: Seconds a solve keeps back at the end for reading its plan out, besides one pass over the graph.
READ_OUT_S = 0.1
#: Seconds one pass over the graph (a ``simulate``: 0.65 s for 100,000 nodes) takes an idle core, a node.
PASS_S_PER_NODE = 1e-5
#: Iterations of :meth:`Deadline.probe_load`'s loop an idle core runs in a second (the fastest of 200 runs here),
#: and how long the probe runs.
PROBE_RATE = 20_000_000
PROBE_S = 0.03


class OutOfTime(CkptError, TimeoutError):
    """A phase stopped before it finished: at the solve's deadline, or at the work it may do.

    Attributes:
        by: ``"time limit"`` (the wall clock: depends on the machine's load) or
            ``"work limit"`` (work the phase counts: the same on any machine).
    """

    def __init__(self, message: str, *, by: str = "time limit") -> None:
        super().__init__(message)
        self.by = by


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
        spent = _SPENT.get()
        if spent:  # the first deadline of a command's solve: what the command spent before it counts
            _SPENT.set(0.0)
        self.start = clock() - spent
        self.pass_s: float | None = None  # one pass over the graph, as timed by the solve here and now
        self.slowdown = 1.0  # how much slower than an idle core this process runs now (:meth:`probe_load`)

    def pass_estimate(self, nodes: int) -> float:
        """Seconds one linear pass over a graph of ``nodes`` nodes takes (one ``simulate``): the pass the
        solve timed (on this machine, at this load) when it did, and no less than an idle core's
        :data:`PASS_S_PER_NODE` a node times the slowdown :meth:`probe_load` measured."""
        return max(PASS_S_PER_NODE * nodes * self.slowdown, self.pass_s or 0.0)

    def probe_load(self, probe_s: float = PROBE_S) -> None:
        """Run a plain Python loop for about ``probe_s`` and set :attr:`slowdown` from how far it got against
        an idle core's :data:`PROBE_RATE` (a probe of several scheduler slices: a millisecond's probe often
        runs whole and sees no load). For a graph whose passes are a large part of the limit only."""
        done, stop = 0, time.perf_counter() + probe_s
        start = time.perf_counter()
        while time.perf_counter() < stop:
            x = 0
            for i in range(1000):
                x += i * i
            done += 1000
        took = time.perf_counter() - start
        self.slowdown = max(1.0, took * PROBE_RATE / max(done, 1))

    def read_out_s(self, nodes: int) -> float:
        """Seconds kept back at the end for reading a plan out: :data:`READ_OUT_S` and one pass."""
        return READ_OUT_S + self.pass_estimate(nodes)

    def elapsed(self) -> float:
        """Seconds since the deadline was made."""
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.limit_s - self.elapsed())

    def expired(self) -> bool:
        """Whether no time is left."""
        return self.left() <= 0.0

    def before(self, keep_s: float) -> "Deadline":
        """A deadline ``keep_s`` seconds before this one (for a phase that must leave that much), same clock."""
        sub = Deadline(max(0.0, self.left() - keep_s), clock=self.clock)
        sub.pass_s, sub.slowdown = self.pass_s, self.slowdown
        return sub

    def check(self, what: str) -> None:
        """Raise :class:`OutOfTime` naming ``what`` when no time is left."""
        if self.expired():
            raise OutOfTime(f"{what} stopped at the {self.limit_s:g} s time limit")

    def __repr__(self) -> str:
        return f"Deadline({self.limit_s:g} s, {self.left():.3g} s left)"


@contextlib.contextmanager
def already_spent(seconds: float) -> Iterator[None]:
    """Within this block the first :class:`Deadline` made starts ``seconds`` ago (NOTE [ One deadline ]: a
    command's time limit covers its start and its input)."""
    token = _SPENT.set(max(0.0, float(seconds)))
    try:
        yield
    finally:
        _SPENT.reset(token)


def spent_before() -> float:
    """The seconds :func:`already_spent` says are gone before the next :class:`Deadline` (0.0 outside such a
    block, or once that deadline is made): what a caller adds to its own count of a solve's limit."""
    return _SPENT.get()


def process_age_s() -> float:
    """Seconds since this process started (Linux's ``/proc``), 0.0 where that cannot be read."""
    try:
        import os

        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = float(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def stopped(exc: BaseException) -> bool:
    """``exc`` says a solver stopped at its time or work limit without a plan (:class:`OutOfTime`, or ``ilp``'s
    ``IlpTimeout``), not that the input was wrong (NOTE [ One deadline ])."""
    if isinstance(exc, OutOfTime):
        return True
    cpsat = sys.modules.get("solvers.cpsat.solver")  # loaded whenever it raised
    return cpsat is not None and isinstance(exc, cpsat.IlpTimeout)
