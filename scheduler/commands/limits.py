"""``ckpt solve``'s time limit kept over the whole command, its input included.

NOTE [ The command's time limit ]
    NOTE [ One deadline ] (``solvers.deadline``) has the solve count what the
    command spent before it; this is the command's side. ``ckpt solve`` makes
    one :class:`CommandDeadline` when its arguments are read, started when
    the process started (Python's start and the imports count), for the
    limit the solve will keep: ``--time-limit``, else ``-S time_limit_s``,
    else the solver's default (60 s for ``ilp``, ``dp``...); solvers without
    a time limit and ``--solver all`` (each solver its own limit) read
    without one. Every phase before the solve runs under it:

    * reading the graph (``graphs.load`` with a check: NOTE [ Reading a graph
      under a deadline ] in ``graphs.reading``) and the budget (store-all's
      simulation, for a fraction) stop once no more than :data:`OUTPUT_S` is
      left, and the command answers at once, in one line, with what took the
      time: "no plan within 10 s: reading the graph took 5.6 s and was not
      done (building the graph's nodes (12,288 of 20,000)), after 4.4 s to
      start". A 20,000-node chain's 10 MB file took 13 s to read at a load of
      8, after 4-6 s to start Python there, and the solve's own deadline
      found its limit spent before it began; nothing answered until 29 s;
    * the solve runs with what is left (``already_spent``); a solver's own
      "no plan within N s" adds how much of the limit the input took, when
      that was more than a tenth of it;
    * once the answer is out, the process ends without Python's teardown
      (``scheduler.cli.program``): collecting a CP-SAT model and unloading
      OR-Tools and numba took 0.3 s idle and 1-4 s at a load of 8, after the
      plan was written and before the shell got its prompt back. The graph,
      and what a stopped reading had parsed, are left alive to that end
      (:func:`keep_to_exit`: freeing them took 0.1 s idle, 0.6 s loaded), and
      the graph's objects are frozen out of the garbage collector's walks
      (``gc.freeze`` in :func:`load_graph`, undone by :func:`thaw` when the
      command returns to a caller's process).

    No plan can be known before the graph is read, so a limit the reading
    does not fit answers without one. Tests drive the phases with a clock
    of their own (:data:`_clock`) and checks that stop at a chosen call, so
    nothing in them depends on the machine's speed.
"""

from __future__ import annotations

import gc
import inspect
import time
from typing import Callable, TypeVar

import graphs
from graphs import Graph
from graphs.reading import checking
from solvers import solver_info
from solvers.deadline import Deadline, OutOfTime, already_spent, stopped

__all__ = ["OUTPUT_S", "CommandDeadline", "command_limit", "keep_to_exit", "let_go", "load_graph", "thaw"]

#: Seconds a time limit keeps back for writing the plan and printing it (NOTE [ One deadline ]).
OUTPUT_S = 0.1
#: The clock the command's deadline reads (tests replace it).
_clock: Callable[[], float] = time.monotonic
#: What the last command built (its graph; what a stopped phase had read), left to the process's end.
_LEFT: list = []
_FROZEN: list = []  # load_graph froze the collector's objects (thaw() gives them back)

T = TypeVar("T")


def command_limit(solver: str, options: dict) -> float | None:
    """The seconds ``solver`` will keep with ``options``: their ``time_limit_s``, else the solver's default;
    None for a solver without a time limit."""
    if "time_limit_s" in options:
        return options["time_limit_s"]
    try:
        default = inspect.signature(solver_info(solver).fn).parameters["time_limit_s"].default
    except (KeyError, ValueError, TypeError):
        return None
    return float(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else None


class _Stop(Exception):
    """A phase found the limit spent; ``what`` says where it got."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class CommandDeadline:
    """The command's one deadline over its phases (NOTE [ The command's time limit ]).

    Args:
        limit_s: the limit the user gave (or the solver's default).
        spent_s: seconds the command ran before this (Python's start, imports, arguments).
    """

    def __init__(self, limit_s: float, spent_s: float) -> None:
        with already_spent(spent_s):
            self.deadline = Deadline(limit_s, clock=_clock)
        self.limit_s = self.deadline.limit_s
        self.start_s = spent_s
        self.took: list[tuple[str, float]] = []  # (phase, seconds) of the phases done
        self.before_solve_s = 0.0  # seconds gone when the solve started

    def _check(self, what: str) -> None:
        if self.deadline.left() <= OUTPUT_S:
            raise _Stop(what)

    def run(self, phase: str, work: Callable[[], T]) -> T:
        """``work()`` with its reading and simulations checking the deadline; a phase that finds it spent (or
        has nothing left when it starts or ends) ends the command with :meth:`late`."""
        t0 = self.deadline.elapsed()
        try:
            self._check("not started")
            with checking(self._check):
                out = work()
        except _Stop as stop:
            keep_to_exit(stop)  # its traceback holds what was read: freeing it is not part of the answer
            raise OutOfTime(self.late(phase, self.deadline.elapsed() - t0, stop.what)) from None
        self.took.append((phase, self.deadline.elapsed() - t0))
        return out

    def left_for_solve(self) -> None:
        """Raise :class:`OutOfTime` when nothing is left for the solve after the phases before it."""
        self.before_solve_s = self.deadline.elapsed()
        if self.deadline.left() <= OUTPUT_S:
            raise OutOfTime(self.late("", 0.0, ""))

    def spent_s(self) -> float:
        """Seconds of the limit gone, the output's reserve included (what the solve is started with)."""
        return self.deadline.elapsed() + OUTPUT_S

    def late(self, phase: str, took_s: float, where: str) -> str:
        """The one line of a command whose limit ran out before the solve."""
        done = ", ".join(f"{name} took {s:.1f} s" for name, s in self.took)
        if phase:
            stuck = (f"{phase} was not started" if where == "not started" else
                     f"{phase} took {took_s:.1f} s and was not done ({where})")
            text = f"{done}, and {stuck}" if done else stuck
        else:
            text = f"{done}, and no time was left to solve" if done else "no time was left to solve"
        return (f"no plan within {self.limit_s:g} s: {text}, after {self.start_s:.1f} s to start (Python and the "
                f"imports; longer on a busy machine); raise --time-limit")

    def note(self, exc: BaseException) -> BaseException:
        """A solver's "no plan within N s" with how much of the limit the input took, when over a tenth."""
        spent = self.before_solve_s
        if not stopped(exc) or spent <= 0.1 * self.limit_s:
            return exc
        names = ["starting"] + [name for name, _ in self.took]
        went = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        text = f"{str(exc).rstrip('.')} ({spent:.1f} s of the {self.limit_s:g} s went to {went} before the solve)"
        if isinstance(exc, OutOfTime):
            return OutOfTime(text, by=exc.by)
        try:
            return type(exc)(text)
        except TypeError:  # pragma: no cover (every stopped() error takes one message)
            return exc


def keep_to_exit(*objects: object) -> None:
    """Leave ``objects`` alive until the process ends (``scheduler.cli.program`` ends ``ckpt solve`` without
    Python's teardown): freeing a 20,000-node graph, or the nodes a stopped reading had parsed, took 0.1 s idle
    and 0.6 s at a load of 8, after the answer. The next command lets go of them (:func:`let_go`)."""
    _LEFT.extend(objects)


def let_go() -> None:
    """A command starts: what the last one left (:func:`keep_to_exit`) may be freed."""
    _LEFT.clear()


def load_graph(path: str, deadline: CommandDeadline | None) -> Graph:
    """``graphs.load(path)``, under ``deadline`` when there is one, and what it made kept out of the garbage
    collector's way until :func:`thaw` (``gc.freeze``): the first collection after reading a 20,000-node graph
    walked its objects for 0.07 s idle (1 s at a load of 8) where no check could stop it, and every full
    collection during the solve walked them again; they are the graph, alive to the end."""
    collecting = gc.isenabled()
    gc.disable()  # graphs.load leaves it so: no collection set off between reading and the freeze
    try:
        if deadline is None:
            return graphs.load(path)
        return deadline.run("reading the graph", lambda: graphs.load(path, check=deadline._check))
    finally:
        gc.freeze()
        _FROZEN.append(True)
        if collecting:
            gc.enable()


def thaw() -> None:
    """The command ends: what :func:`load_graph` froze is the collector's again (for a caller's own process;
    ``ckpt`` run as the program ends without a collection)."""
    if _FROZEN:
        _FROZEN.clear()
        gc.unfreeze()
