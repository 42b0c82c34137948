"""Running a CP-SAT search: its parameters (NOTE [ CP-SAT's LP ]), its progress in the log, and
Ctrl-C stopping it (NOTE [ Ctrl-C during CP-SAT ])."""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ortools.sat.python import cp_model

__all__ = ["ModelResult", "Progress", "new_solver", "run_cp_sat", "STOP_GRACE_S"]


@dataclass(frozen=True)
class ModelResult:
    """What one CP-SAT run returned.

    Attributes:
        status: ``optimal``, ``feasible``, ``infeasible`` or ``unknown``.
        regions: the plan read out, or None; objective: its objective (FLOPs, or peak bytes).
        bound: CP-SAT's proven lower bound on the objective.
        wall_s: CP-SAT's wall time; work: its deterministic time (not load-dependent).
    """

    status: str
    regions: tuple[tuple[int, int], ...] | None
    objective: float
    bound: float
    wall_s: float
    work: float = 0.0

#: Seconds a search told to stop at the deadline may take to return before it is left running
#: (NOTE [ CP-SAT past its time limit ]).
STOP_GRACE_S = 0.5

log = logging.getLogger(__name__)


def new_solver(*, time_limit_s: float, workers: int, gap_limit: float = 0.0, work_limit: float | None = None,
               seed: int = 0) -> cp_model.CpSolver:
    """A CP-SAT solver set up for the checkpoint model (arguments as in ``CheckpointModel.solve``)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.random_seed = int(seed)
    if work_limit is not None:
        solver.parameters.max_deterministic_time = float(work_limit)
        solver.parameters.interleave_search = True
    if gap_limit > 0:
        solver.parameters.relative_gap_limit = float(gap_limit)
    solver.parameters.num_workers = int(workers)
    # NOTE [ CP-SAT's LP ]: the default full-problem worker linearises only
    # linear constraints; the clauses that tie a tensor's lifetime to the
    # region variables (``held``, ``same``) stay out of its LP, whose bound
    # then sits near zero (99.9 % gap on a 100-node residual graph after
    # 10 s). ``max_lp`` (linearization level 2) puts them in: the same
    # graph is proven optimal in 0.4 s. With few workers it must be asked
    # for by name; the other workers run neighbourhood search.
    if workers == 1:
        solver.parameters.linearization_level = 2
    elif workers < 8:
        solver.parameters.subsolvers.extend(["max_lp"] + ["quick_restart", "default_lp", "core"][:max(0, workers - 2)])
    return solver


class Progress(cp_model.CpSolverSolutionCallback):
    """Logs every incumbent with the bound, as CP-SAT finds them."""

    def __init__(self, unit: int = 1) -> None:
        super().__init__()
        self.count = 0
        self.unit = unit

    def on_solution_callback(self) -> None:
        self.count += 1
        log.info("ilp incumbent %d: objective %.6g, bound %.6g, %.2fs",
                 self.count, self.ObjectiveValue() * self.unit, self.BestObjectiveBound() * self.unit, self.WallTime())


def run_cp_sat(solver: cp_model.CpSolver, model: cp_model.CpModel,
               callback: cp_model.CpSolverSolutionCallback | None = None, *,
               expired: Callable[[], bool] | None = None) -> int | None:
    """``solver.Solve(model, callback)``, stopped by Ctrl-C within a fraction of a second, and at the deadline.

    NOTE [ Ctrl-C during CP-SAT ]
        By default CP-SAT installs its own SIGINT handler for the length of a
        solve: Ctrl-C then ends the search *as if the time limit were
        reached* (the caller gets the incumbent, 95 % gap and all, as an
        ordinary answer), and on return it sets SIGINT to ``SIG_DFL``, so the
        next Ctrl-C kills the process with no message and Python's
        ``KeyboardInterrupt`` is gone for good. So ``catch_sigint_signal`` is
        off, and in the main thread the search runs in a worker thread while
        the main thread waits in short joins, where Python delivers
        ``KeyboardInterrupt``; the search is then stopped through CP-SAT's own
        ``stop_search`` and the interrupt re-raised: no result of an
        interrupted search is ever returned. The SIGINT handler found on entry
        is put back on the way out, whatever OR-Tools did to it.
        ``tests/scheduler/test_bad_inputs.py::test_sigint_stops_cp_sat`` sends a real
        SIGINT to a running solve.

    NOTE [ CP-SAT past its time limit ]
        CP-SAT's own ``max_time_in_seconds`` is not kept on a loaded machine:
        a 700-node random DAG asked for 35 s ran 61.6 s with both cores busy
        (its presolve and LP look at the clock seldom). So the waiting thread
        also watches the solve's deadline (``expired``): once it passes the
        search is told to stop (``stop_search``), and if it has not returned
        :data:`STOP_GRACE_S` later it is left to finish on its own, in its
        daemon thread, and its answer is never read (None is returned): the
        caller answers with what it had. ``expired`` says so while the grace
        and what follows the search are still left (NOTE [ What follows a
        search ] in ``solvers.cpsat.model``), not at the deadline itself.

    Returns:
        CP-SAT's status, or None when the search was left running past the deadline.
    """
    solver.parameters.catch_sigint_signal = False
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    box: dict[str, object] = {}

    def search() -> None:
        try:
            box["status"] = solver.Solve(model, callback)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            box["error"] = exc

    worker = threading.Thread(target=search, name="cp-sat", daemon=True)
    worker.start()
    stopped_at = None
    try:
        while worker.is_alive():
            worker.join(0.05)
            if stopped_at is None and expired is not None and worker.is_alive() and expired():
                solver.stop_search()
                stopped_at = time.monotonic()
            elif stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
                if worker.is_alive():
                    log.warning("ilp: CP-SAT did not stop at the deadline; its answer is not waited for")
                    return None
    except BaseException:
        while worker.is_alive():  # stop_search is a no-op until the search has started: repeat
            solver.stop_search()
            worker.join(0.05)
        raise
    finally:
        if handler is not None and signal.getsignal(signal.SIGINT) is not handler:
            signal.signal(signal.SIGINT, handler)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return int(box["status"])  # type: ignore[call-overload]
