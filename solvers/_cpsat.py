"""Running a CP-SAT search so that Ctrl-C stops it (NOTE [ Ctrl-C during CP-SAT ])."""

from __future__ import annotations

import signal
import threading

from ortools.sat.python import cp_model

__all__ = ["run_cp_sat"]


def run_cp_sat(solver: cp_model.CpSolver, model: cp_model.CpModel,
               callback: cp_model.CpSolverSolutionCallback | None = None) -> int:
    """``solver.Solve(model, callback)``, stopped by Ctrl-C within a fraction of a second.

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

    Returns:
        CP-SAT's status.
    """
    solver.parameters.catch_sigint_signal = False
    if threading.current_thread() is not threading.main_thread():
        return solver.Solve(model, callback)
    handler = signal.getsignal(signal.SIGINT)
    box: dict[str, object] = {}

    def search() -> None:
        try:
            box["status"] = solver.Solve(model, callback)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            box["error"] = exc

    worker = threading.Thread(target=search, name="cp-sat", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
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
