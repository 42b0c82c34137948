"""``ckpt solve``'s time limit armed before Python imports the project (the program: ``scheduler.__main__``).

NOTE [ A limit kept from the first instant ]
    NOTE [ The command's time limit ] counts the process's start and imports
    against ``--time-limit``, but they ran before any of its checks: at a
    load of 8 on 2 cores, Python and the imports alone took 2.1-2.5 s, and a
    1 s limit answered after 2.3 s. So the program (``scheduler.__main__``,
    the console script's entry) starts with this module, of the standard
    library only (``import scheduler`` loads nothing either: each name of
    ``scheduler/__init__.py`` is imported on first use), and imports the CLI
    after it. Its
    :func:`arm` reads the limit from the arguments (``--time-limit N``, or
    ``-S time_limit_s=N``) and sets a timer for what is left of it, less the
    answer's reserve (``OUTPUT_S``), counted from the process's start. If the
    timer fires before the command has read its arguments, the command
    answers at once, in one line, exit status 2, as any other "no plan
    within N s", and ends. A timer's handler runs only between two steps of
    the interpreter: while the main thread sat in one long call (a library
    loaded from a busy disk), a 1 s limit answered after 4.6 s. So
    :func:`arm` also forks a watchdog (a process that only waits on a pipe)
    that, 0.05 s after the timer, if the command has neither disarmed nor
    ended, writes the same line and kills it (exit status 137). Once ``scheduler.cli.main`` has its arguments it
    calls :func:`disarm`: from there the command's own deadline stops each
    phase where it can (a timer cannot stop a solver that is writing its
    plan). A limit the arguments do not give (the solver's default, 60 s) is
    not armed: no start takes that long.
"""

from __future__ import annotations

import os
import select
import signal
import sys

__all__ = ["arm", "disarm", "limit_of", "process_age_s"]

#: Seconds of the limit kept back for the answer (``scheduler.commands.limits.OUTPUT_S``: tests check they agree).
OUTPUT_S = 0.1
#: Seconds after the timer the watchdog ends a process whose timer could not answer (within the reserve).
WATCHDOG_AFTER_S = 0.05
_ARMED: list[float] = []  # the limit armed, while it is
_WATCH: list[int] = []  # the watchdog's pid and the write end of its pipe, while it waits


def process_age_s(pid: int | str = "self") -> float:
    """Seconds since process ``pid`` (this one by default) started (Linux's ``/proc``), 0.0 where that cannot
    be read.

    ``solvers.deadline.process_age_s`` reads the same but is reached only through ``solvers``' imports;
    nothing calls it now (left until solvers/ changes next: its removal would date every results page)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            start_ticks = float(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 and value == value and value != float("inf") else None


def limit_of(argv: list[str]) -> float | None:
    """The time limit ``ckpt`` ``argv`` gives ``solve`` (``-S time_limit_s=`` over ``--time-limit``, as the
    command reads them), or None: another command, ``--solver all`` (each solver its own limit), no limit
    given, or one the parser will refuse (it says why)."""
    words = [w for w in argv if not (w.startswith("-v") and set(w[1:]) == {"v"}) and w != "--verbose"]
    if not words or words[0] != "solve":
        return None
    flag = option = None
    for word, nxt in zip(words, words[1:] + [""]):
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        value = value if eq else nxt
        if name == "--time-limit":
            flag = _seconds(value)
        elif name == "--solver" and value == "all":
            return None
        elif name in ("-S", "--solver-option") or (name.startswith("-S") and len(name) > 2):
            pair = value if name in ("-S", "--solver-option") else name[2:]
            key, _, text = pair.partition("=")
            if key.strip() == "time_limit_s":
                option = _seconds(text)
    return option if option is not None else flag


def _line(limit: float, age_s: float) -> bytes:
    return (f"ckpt solve: error: no plan within {limit:g} s: Python and the imports took {age_s:.1f} s and were "
            f"not done (a busy machine starts slowly); raise --time-limit\n").encode()


def _late(signum: int, frame: object) -> None:  # noqa: ARG001
    try:
        sys.stderr.flush()
        os.write(2, _line(_ARMED[0] if _ARMED else 0.0, process_age_s()))
    finally:
        os._exit(2)


def _watchdog(limit: float, seconds: float) -> None:
    """Fork a process that waits ``seconds`` for this one to let go of a pipe (:func:`disarm`, or its end);
    if it has not, it says so in the command's line and ends it (``SIGKILL``: exit status 137)."""
    try:
        r, w = os.pipe()
        pid = os.fork()
    except OSError:  # no watchdog: the timer alone
        return
    if pid == 0:  # the watchdog: only calls that take no lock the parent's threads could have held
        try:
            os.close(w)
            parent = os.getppid()
            if not select.select([r], [], [], seconds)[0]:
                os.write(2, _line(limit, process_age_s(parent)))
                os.kill(parent, signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(r)
    _WATCH[:] = [pid, w]


def arm(argv: list[str]) -> float | None:
    """Set the timer for ``ckpt`` ``argv``'s time limit, counted from the process's start, and the watchdog
    just after it; the limit, or None when there is none to arm (nothing is set then)."""
    limit = limit_of(argv)
    if limit is None or not hasattr(signal, "setitimer"):
        return None
    _ARMED[:] = [limit]
    left = max(limit - OUTPUT_S - process_age_s(), 1e-3)
    signal.signal(signal.SIGALRM, _late)
    signal.setitimer(signal.ITIMER_REAL, left)
    _watchdog(limit, left + WATCHDOG_AFTER_S)
    return limit


def disarm() -> None:
    """The command has its arguments: its own deadline takes over (a no-op when nothing was armed)."""
    if _ARMED:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        _ARMED.clear()
    if _WATCH:
        pid, w = _WATCH
        _WATCH.clear()
        os.close(w)  # the watchdog reads the end of its pipe and ends
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
