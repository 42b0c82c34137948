"""Time limits on big graphs (issue 33, item 9), checked with a fake clock, stand-in compiles and small work
rates, never the wall clock: NOTE [ dp under a time limit ] (``solvers.dp.limited``) and the phases of
``ilp`` that once ran past NOTE [ One deadline ] on wide graphs."""

from __future__ import annotations

import json

import pytest

import solvers
from graphs import save, synthetic
from solvers import Deadline, activation_budget_bytes, simulate
from solvers.deadline import OutOfTime
from solvers.dp import chain as dp_chain
from solvers.dp import kernel as dp_kernel
from solvers.dp import limited
from solvers.frontier import phases, program as frontier_program


class HandClock:
    """A clock that moves only when a test (or a stand-in) moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TickClock:
    """A clock that moves ``step`` seconds at every reading (work that takes time, on any machine)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture
def no_probe(monkeypatch):
    monkeypatch.setattr(Deadline, "probe_load", lambda self, *a: None)  # an idle core, whatever the machine


def _regions_within(plan, graph, max_len: int) -> bool:
    st = solvers.stages(graph)
    index = {n: k for k, n in enumerate(st.starts)}
    ends = {n: k for k, n in enumerate(st.ends)}
    return all(ends[b] - index[a] + 1 <= max_len for a, b in plan.regions)


# ------------------------------------------------------------------ dp takes a time limit and keeps it
def test_dp_takes_a_time_limit():
    g = synthetic.make("chain", 40)
    budget = activation_budget_bytes(g, 0.4)
    plan = solvers.solve(g, budget, solver="dp", time_limit_s=30)
    free = solvers.solve(g, budget, solver="dp", time_limit_s=None)
    assert plan.status == "optimal" and (plan.regions, plan.recompute_cost) == (free.regions, free.recompute_cost)


def test_dp_cuts_its_regions_to_what_the_limit_allows_and_says_so(monkeypatch, no_probe):
    g = synthetic.make("chain", 300)
    budget = activation_budget_bytes(g, 0.5)
    exact = solvers.solve(g, budget, solver="dp", time_limit_s=None)
    full = dp_chain.fill_work(solvers.stages(g))
    # The kernel at hand fills a tenth of the table in the share of 1 s it gets: regions are cut, not the answer.
    monkeypatch.setattr(dp_kernel, "WORK_PER_S", {True: full // 10, False: full // 10})
    monkeypatch.setattr(dp_kernel, "compiled_ready", lambda: True)
    plan = limited.dp_within(g, budget, Deadline(1.0, clock=HandClock()), max_front=None, selective=True,
                             nested=False)
    assert plan.status == "feasible" and "at most" in plan.findings["optimal_over"]
    max_len = int(plan.findings["optimal_over"].split("at most ")[1].split()[0])
    assert 1 <= max_len < len(g) and _regions_within(plan, g, max_len)
    assert simulate(g, plan, record=False).peak_bytes <= budget
    cost = simulate(g, plan, record=False).recompute_cost
    assert cost >= exact.recompute_cost  # optimal over fewer regions: never cheaper


def test_dp_counts_the_kernel_compile_against_its_limit(monkeypatch, no_probe):
    """A cold numba cache: the compile is waited for only within its share of the limit, on the deadline's
    clock; then the plain kernel fills what is left (here, all of the small table)."""
    g = synthetic.make("chain", 200)
    budget = activation_budget_bytes(g, 0.5)
    clock = HandClock()
    waited = []

    def compile_that_takes_10_s(timeout_s):  # stands for numba's import and a cold compile of 10 s
        waited.append(timeout_s)
        clock.now += min(timeout_s, 10.0)
        return False  # not ready within the wait

    monkeypatch.setattr(dp_kernel, "compiled_ready", lambda: False)
    monkeypatch.setattr(dp_kernel, "cache_is_warm", lambda: True)  # a load (1.5 s) fits the share: waited for
    monkeypatch.setattr(dp_kernel, "wait_for_compiled", compile_that_takes_10_s)
    monkeypatch.setattr(dp_kernel, "WORK_PER_S", {True: 10**9, False: 1000})  # the plain copy: slow
    monkeypatch.setattr(dp_chain, "kernel", lambda wait: (dp_kernel.plain_kernel(), False))
    deadline = Deadline(4.0, clock=clock)
    plan = limited.dp_within(g, budget, deadline, max_front=None, selective=True, nested=False)
    assert len(waited) == 1 and 0 < waited[0] <= limited.KERNEL_SHARE * 4.0
    assert clock.now <= 4.0 and simulate(g, plan, record=False).peak_bytes <= budget


def test_dp_does_not_start_a_cold_compile_its_limit_cannot_hold(monkeypatch, no_probe):
    g = synthetic.make("chain", 200)
    budget = activation_budget_bytes(g, 0.5)
    monkeypatch.setattr(dp_kernel, "compiled_ready", lambda: False)
    monkeypatch.setattr(dp_kernel, "cache_is_warm", lambda: False)  # a 12 s compile in a 4 s limit
    monkeypatch.setattr(dp_kernel, "wait_for_compiled", lambda t: pytest.fail("a compile the limit cannot hold"))
    monkeypatch.setattr(dp_kernel, "WORK_PER_S", {True: 10**9, False: 1000})
    monkeypatch.setattr(dp_chain, "kernel", lambda wait: (dp_kernel.plain_kernel(), False))
    plan = limited.dp_within(g, budget, Deadline(4.0, clock=HandClock()), max_front=None, selective=True,
                             nested=False)
    assert simulate(g, plan, record=False).peak_bytes <= budget


def test_the_warm_cache_is_found_without_numba(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert not dp_kernel.cache_is_warm()
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "x" / "y" / "_kernel.merge_stage-258.py311.nbi").write_bytes(b"")
    assert dp_kernel.cache_is_warm()


def test_dp_without_time_for_a_table_says_no_plan_within_the_limit(monkeypatch, no_probe):
    g = synthetic.make("chain", 200)
    monkeypatch.setattr(dp_kernel, "compiled_ready", lambda: True)
    monkeypatch.setattr(dp_kernel, "WORK_PER_S", {True: 1, False: 1})
    with pytest.raises(OutOfTime, match=r"dp: no plan within 2 s"):
        limited.dp_within(g, activation_budget_bytes(g, 0.5), Deadline(2.0, clock=HandClock()), max_front=None,
                          selective=True, nested=False)


def test_dp_with_too_little_left_for_its_first_passes_answers_at_once(no_probe):
    """Issue 33: ``dp`` on a 20,000-node chain at a load of 8 began its solve with its limit spent (reading the
    graph had taken it) and still took 4.5 s for the graph's fingerprint and stages before saying so. As ``ilp``,
    it now answers at once where what is left cannot hold its first passes and the read-out."""
    g = synthetic.make("chain", 300)
    clock = HandClock()
    deadline = Deadline(2.0, clock=clock)
    clock.now = 1.95
    with pytest.raises(OutOfTime, match=r"dp: no plan within 2 s: 0.05 s were left when it started"):
        limited.dp_within(g, activation_budget_bytes(g, 0.5), deadline, max_front=None, selective=True, nested=False)
    assert "_fingerprint" not in g.__dict__  # not one pass made


def test_dp_probes_the_load_against_what_is_left_not_its_limit(monkeypatch):
    """A 20,000-node chain at a load of 8: the command had spent 9 of its 10 s reading the graph, dp's passes
    were a small part of its limit, so it did not probe the load, took a pass for 0.2 s and began: its
    fingerprint alone took 3 s. The passes are weighed against what is left, the load probed, and it answers
    at once. (Here a pass of 300 nodes costs what 20,000 do on an idle core, and the probe finds a load.)"""
    g = synthetic.make("chain", 300)
    from solvers import deadline as deadline_mod

    per_node = 2e-5 * 20_000 / 300 / 3  # 3 passes: 0.4 s on an idle core
    monkeypatch.setattr(limited, "PASS_S_PER_NODE", per_node)
    monkeypatch.setattr(deadline_mod, "PASS_S_PER_NODE", per_node)
    probed = []

    def loaded(self, *args) -> None:
        probed.append(True)
        self.slowdown = 10.0

    monkeypatch.setattr(Deadline, "probe_load", loaded)
    clock = HandClock()
    deadline = Deadline(10.0, clock=clock)
    clock.now = 9.0
    with pytest.raises(OutOfTime, match=r"dp: no plan within 10 s: 1 s were left when it started"):
        limited.dp_within(g, activation_budget_bytes(g, 0.5), deadline, max_front=None, selective=True, nested=False)
    assert probed and "_fingerprint" not in g.__dict__


def test_dp_stops_filling_at_its_deadline(monkeypatch, no_probe):
    g = synthetic.make("chain", 400)
    monkeypatch.setattr(dp_kernel, "compiled_ready", lambda: True)
    with pytest.raises(OutOfTime, match=r"no plan within 1 s: its table"):  # each reading of the clock: 10 ms
        limited.dp_within(g, activation_budget_bytes(g, 0.5), Deadline(1.0, clock=TickClock(0.01)),
                          max_front=None, selective=True, nested=False)


def test_the_paced_region_length_follows_the_time_left():
    clock = HandClock()
    deadline = Deadline(10.0, clock=clock)
    clock.now = 5.0  # 32 stages took 5 s; 5 s are left for 100 stages: far too slow, the length drops
    cap, paced = dp_chain._paced(64, (0.0, 132), 100, deadline, 1000)
    assert cap < 64 and paced == (5.0, 100)
    clock.now = 5.001  # 32 stages in a millisecond: far ahead, the length grows (never past the chain)
    cap2, _ = dp_chain._paced(cap, paced, 68, deadline, 1000)
    assert cap < cap2 <= 1000


def test_dp_table_paced_by_a_slow_clock_still_answers(monkeypatch, no_probe):
    g = synthetic.make("chain", 600)
    budget = activation_budget_bytes(g, 0.6)
    monkeypatch.setattr(dp_kernel, "compiled_ready", lambda: True)
    full = dp_chain.fill_work(solvers.stages(g))
    monkeypatch.setattr(dp_kernel, "WORK_PER_S", {True: full // 4, False: full // 4})
    clock = TickClock(0.01)  # about 12 s of readings in all: the pace lets regions grow back
    plan = limited.dp_within(g, budget, Deadline(50.0, clock=clock), max_front=None, selective=True, nested=False)
    assert clock.now <= 50.0 and simulate(g, plan, record=False).peak_bytes <= budget


def test_ckpt_solve_dp_takes_time_limit(tmp_path, capsys):
    from scheduler.cli import main

    path = tmp_path / "chain.json"
    save(synthetic.make("chain", 30), str(path))
    assert main(["solve", str(path), "--budget", "0.5", "--solver", "dp", "--time-limit", "20",
                 "-o", str(tmp_path / "plan.json")]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["status"] == "optimal"


# ------------------------------------------------------------------ ilp's phases on a wide graph
def test_the_heuristic_does_not_build_open_sets_it_has_no_time_for(monkeypatch):
    """A 5,000-node DAG with 1,264 tensors open at one position: its open sets are 4.3 million entries, once
    built (10 s) past a 10 s limit. The build is weighed against the deadline first."""
    g = synthetic.random_dag(300, width=8)
    monkeypatch.setattr(frontier_program, "OPEN_ENTRIES_PER_S", 10)  # this graph's sets: minutes at this rate
    monkeypatch.setattr(frontier_program, "_open_sets", lambda *a: pytest.fail("open sets built past the deadline"))
    got = phases.frontier_heuristic(g, activation_budget_bytes(g, 0.5), Deadline(5.0, clock=HandClock()), None)
    assert got is None


def test_the_open_sets_are_the_loop_they_replace():
    import numpy as np

    from solvers.frontier.front import _open_sets, open_entries

    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 60):
        lc = np.where(rng.random(n) < 0.3, -1, rng.integers(0, n + 1, n)).astype(np.int64)
        out = rng.integers(0, 3, n).astype(np.int64)
        want = [[] for _ in range(n + 1)]
        for j in range(n):
            if lc[j] > j and out[j] > 0:
                for p in range(j + 1, int(lc[j]) + 1):
                    want[p].append(j)
        assert _open_sets(out, lc) == want and open_entries(out, lc) == sum(map(len, want))


def test_a_long_chain_of_same_literals_checks_the_deadline():
    """One ``same(j, t)`` makes a literal per node between them (thousands on a wide DAG): the model's
    deadline is looked at as they are made, not only between tensors."""
    from ortools.sat.python import cp_model

    from solvers.cpsat.same import SameLiterals

    g = synthetic.make("chain", 1200)
    m = cp_model.CpModel()
    x = [m.NewBoolVar(f"x{k}") for k in range(len(g))]
    cont = [m.NewConstant(0)] + [m.NewBoolVar(f"c{k}") for k in range(1, len(g))]
    ticks = []
    same = SameLiterals(g, m, x, cont, {}, tick=lambda: ticks.append(1))
    same(0, len(g) - 1)
    assert len(ticks) >= 4


# ------------------------------------------------------------------ the command's time limit covers the command
def test_the_first_deadline_of_a_solve_counts_what_the_command_spent():
    from solvers.deadline import already_spent

    clock = HandClock()
    with already_spent(2.0):
        first, second = Deadline(5.0, clock=clock), Deadline(5.0, clock=clock)
    after = Deadline(5.0, clock=clock)
    assert (first.limit_s, first.left()) == (5.0, 3.0)  # the limit named is the user's; 2 s are gone
    assert second.left() == after.left() == 5.0  # made after it: handed what is left by the solve itself


def test_ckpt_solve_time_limit_covers_the_start_of_the_command(tmp_path, capsys, monkeypatch):
    """Issue 33: ``ckpt solve DAG700 --budget 0.8 --time-limit 5`` took 7.1-8.7 s at a load of 7-9: Python's
    start, the imports and reading the graph came on top of the limit. Here the command is 'started' 4.95 s
    ago: what is left cannot hold a plan, and the answer says so at once, naming the user's limit."""
    import sys

    from scheduler import cli

    path = tmp_path / "dag.json"
    save(synthetic.make("random-dag", 60), str(path))
    argv = ["ckpt", "solve", str(path), "--budget", "0.8", "--time-limit", "5"]
    monkeypatch.setattr(sys, "argv", argv)  # run as the program: main() reads sys.argv
    monkeypatch.setattr(cli, "process_age_s", lambda: 4.95)
    assert cli.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "within 5 s" in err[0]
    # Called with argv (a test, a caller's own process: its age is not the command's), the limit starts at main().
    assert cli.main(argv[1:]) == 0


def test_a_floor_stopped_by_the_work_limit_names_it_not_the_time_limit():
    """Issue 33: DenseNet said "not proven within 60 s" after 6 s: CP-SAT's deterministic work limit had
    stopped the least-peak search. The message names what stopped it and the lever that goes further."""
    g = synthetic.make("random-dag", 60, seed=3)
    with pytest.raises(solvers.InfeasibleBudget) as info:
        solvers.solve(g, 1, solver="cp-sat", work_limit=1e-3, time_limit_s=600)
    exc, text = info.value, str(info.value)
    assert not exc.proven and "work limit" in exc.stopped_by
    assert "within 600 s" not in text and "stopped by CP-SAT's work limit" in text and "-S work_limit" in text
    assert "of the 600 s time limit" in text  # the limit it did not reach, named as such


@pytest.mark.parametrize("seed", [1, 3])
def test_a_least_peak_cp_sat_proved_is_said_proven(seed):
    """Issue 33: the least-peak model's bound left out the parameters and inputs, so a least peak CP-SAT had
    proven optimal came out 'not proven' (DenseNet: 63.03 MiB against a bound short by its 27.43 MiB of weights
    and inputs). The proven least equals brute force over every interval plan."""
    from solvers.brute_force import brute_force

    g = synthetic.make("random-dag", 10, seed=seed)
    with pytest.raises(solvers.InfeasibleBudget) as exact:
        brute_force(g, 1)
    with pytest.raises(solvers.InfeasibleBudget) as info:
        solvers.solve(g, 1, solver="cp-sat", time_limit_s=600)
    assert info.value.proven and info.value.min_feasible_bytes == exact.value.min_feasible_bytes
    assert "least feasible budget is" in str(info.value) and "not proven" not in str(info.value)


def test_the_model_stops_building_while_what_is_left_can_free_it():
    """A 5,000-node DAG's CP-SAT model stopped at 60 s after 35 s of building, then its garbage took 3.7 s more,
    at the process's exit. The build stops while what is left can free what was built."""
    from solvers.cpsat.model import CLEANUP_SHARE
    from solvers.cpsat.solver import checkpoint_model

    readings = iter([0.0, 0.0])  # the deadline made, the build started; then 90 s of building have passed

    def clock() -> float:
        return next(readings, 90.0)

    g = synthetic.make("random-dag", 40)
    assert 10.0 < CLEANUP_SHARE * 90.0  # 10 s left is less than freeing 90 s of building takes
    with pytest.raises(OutOfTime):
        checkpoint_model()(g, budget_bytes=activation_budget_bytes(g, 0.5), deadline=Deadline(100.0, clock=clock))
