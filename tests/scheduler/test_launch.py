"""``ckpt``'s time limit armed before the imports (NOTE [ A limit kept from the first instant ] in ``scheduler.launch``).

At a load of 8 on 2 cores Python and the imports alone took 2.1-2.5 s, so ``ckpt solve --time-limit 1`` answered
after 2.3 s (benchmarks/results/limits.md). The tests drive the timer with limits far below any start and a sleep
far above them: nothing depends on the machine's speed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from scheduler import launch
from scheduler.commands import limits

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          check=False)


def test_import_scheduler_loads_nothing_of_the_project():
    """``import scheduler`` ran graphs, solvers and numpy (0.40 s idle): the program's timer could not be set
    before them. Now each name loads on first use, and the names are the same objects as before; a submodule
    imported by name (``from scheduler import launch``) loads no more than itself (it once loaded ``api``:
    2.6 s at a load of 8)."""
    out = _python("import sys, json, scheduler; from scheduler import launch; "
                  "print(json.dumps([m for m in ('numpy', 'graphs', 'solvers', 'torch', 'scheduler.api') "
                  "if m in sys.modules]))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
    import graphs
    import scheduler
    import solvers
    from scheduler import api
    from scheduler.sizing import budget

    assert scheduler.load_graph is graphs.load and scheduler.save_graph is graphs.save
    assert scheduler.Plan is solvers.Plan and scheduler.solve is api.solve
    assert scheduler.parse_size is budget.parse_size and scheduler.api is api
    assert scheduler.sizing is sys.modules["scheduler.sizing"]
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        scheduler.nothing_here  # noqa: B018


@pytest.mark.parametrize("argv, limit", [
    (["solve", "g.json", "--time-limit", "3"], 3.0),
    (["solve", "g.json", "--time-limit=2.5"], 2.5),
    (["-v", "solve", "g.json", "-S", "time_limit_s=4", "--time-limit", "3"], 4.0),  # -S wins, as in the command
    (["solve", "g.json", "-Stime_limit_s=7"], 7.0),
    (["solve", "g.json", "--solver-option=time_limit_s=8"], 8.0),
    (["solve", "g.json", "--solver", "all", "--time-limit", "3"], None),  # each solver its own limit
    (["solve", "g.json", "--solver=all", "--time-limit", "3"], None),
    (["trace", "gpt", "--time-limit", "3"], None),
    (["solve", "g.json"], None),  # the solver's default: no start takes 60 s
    (["solve", "g.json", "--time-limit", "soon"], None),  # the parser refuses it, saying why
    (["solve", "g.json", "--time-limit", "-1"], None),
])
def test_the_limit_is_read_as_the_command_reads_it(argv, limit):
    assert launch.limit_of(argv) == limit


def test_a_start_longer_than_the_limit_answers_at_the_limit():
    """The timer fires while the process is still starting (here: asleep far past the limit) and the command
    answers in one line, exit status 2, as any "no plan within N s". On a loaded machine the handler may not be
    scheduled within the watchdog's 0.05 s (a CI run beside two benchmark streams on 2 cores: exit -9): the
    watchdog then says the same line and ends the process."""
    out = _python("from scheduler import launch; launch.arm(['solve', 'g.json', '--time-limit', '0.3']); "
                  "import time; time.sleep(100); print('not stopped')")
    assert out.returncode in (2, -signal.SIGKILL)
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt solve: error: no plan within 0.3 s: Python and the imports")
    assert lines[0].endswith("raise --time-limit")


def test_a_main_thread_that_cannot_answer_is_ended_by_the_watchdog():
    """A timer's handler runs only between two steps of the interpreter: a main thread held in one long call
    (here: the signal blocked, then asleep) answered a 1 s limit after 4.6 s. The watchdog answers for it, in
    the same line, and ends it."""
    # the signal blocked before the timer is set, and the limit half a second past this process's age: on a busy
    # machine the start alone can outlast a fixed limit, and the handler then answered before the block (exit 2)
    out = _python("import signal, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM}); "
                  "from scheduler import launch; "
                  "launch.arm(['solve', 'g.json', '--time-limit', f'{launch.process_age_s() + 0.5:.2f}']); "
                  "time.sleep(100); print('not stopped')")
    assert out.returncode == -signal.SIGKILL
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt solve: error: no plan within ")
    assert "s: Python and the imports" in lines[0]


def test_the_command_disarms_once_it_has_its_arguments(tmp_path):
    """After ``cli.main`` has parsed its arguments the command's own deadline takes over: a timer left armed
    would end a solve that answers in time, or a caller's process after the command returned."""
    from graphs import save, synthetic
    from scheduler import cli

    graph = tmp_path / "g.json"
    save(synthetic.make("chain", 30), graph)
    try:
        assert launch.arm(["solve", str(graph), "--time-limit", "1000"]) == 1000
        left = signal.getitimer(signal.ITIMER_REAL)[0]  # counted from this (test) process's start
        assert 1000 - launch.OUTPUT_S - launch.process_age_s() - 5 < left <= 1000 - launch.OUTPUT_S
        assert cli.main(["solve", str(graph), "--budget", "0.5", "--solver", "chen"]) == 0
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
        assert launch._WATCH == []  # the watchdog let go (its pipe closed, the process reaped)
    finally:
        launch.disarm()


def test_disarm_stops_the_timer_and_the_watchdog():
    out = _python("from scheduler import launch; launch.arm(['solve', 'g.json', '--time-limit', '0.3']); "
                  "launch.disarm(); import time; time.sleep(1.0); print('ran on')")
    assert out.returncode == 0 and out.stdout.strip() == "ran on", out.stderr
    assert out.stderr == ""


def test_the_program_starts_through_the_launcher():
    """The console script and ``python -m scheduler`` arm the limit before importing the project; the reserve for
    the answer is the command's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["ckpt"] == "scheduler.__main__:program"
    out = _python("import json, sys; sys.argv = ['ckpt', 'solve', 'g.json', '--time-limit', '5']; "
                  "import scheduler.launch as launch\n"
                  "def spy(argv):\n"
                  "    print(json.dumps([argv, [m for m in ('scheduler.cli', 'graphs', 'numpy') if m in sys.modules]]))\n"
                  "    raise SystemExit(0)\n"
                  "launch.arm = spy\n"
                  "from scheduler.__main__ import program\n"
                  "program()")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [["solve", "g.json", "--time-limit", "5"], []]
    assert launch.OUTPUT_S == limits.OUTPUT_S
