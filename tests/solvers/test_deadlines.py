"""Limits that hold without a clock in the test: work counted, a fake clock, the kernel never waited for.

NOTE [ The frontier program's work ] (``solvers.frontier.program``), NOTE [ The dp kernel under a deadline ]
(``solvers.dp.kernel``), NOTE [ Linear memory in dp ] (``solvers.dp.profiles``), NOTE [ Bounded warm starts ]
(``solvers.warm``) and NOTE [ One plan space ] (``solvers.ilp``): every check here counts work or moves a
fake clock by hand, so it gives the same result on an idle and on a busy machine.
"""

from __future__ import annotations

import sys
import threading
import tracemalloc

import numpy as np
import pytest

import solvers
from graphs import synthetic
from solvers import Deadline, activation_budget_bytes, simulate
from solvers.dp import kernel as dp_kernel
from solvers import ilp as ilp_mod
from solvers.deadline import OutOfTime
from solvers.dp.chain import DPTable
from solvers.dp.profiles import RegionRows, node_arrays
from solvers.frontier.program import WORK_PER_S, FrontierDP, FrontierTimeout
from solvers.cpsat.solver import IlpTimeout


class StepClock:
    """A clock that reads 0 for its first ``calls`` readings, then ``after``."""

    def __init__(self, calls: int, after: float = 1e9) -> None:
        self.calls, self.after, self.n = calls, after, 0

    def __call__(self) -> float:
        self.n += 1
        return 0.0 if self.n <= self.calls else self.after


# ------------------------------------------------------------------ the frontier program's work
def test_the_program_stops_at_its_work_limit_at_the_same_node_every_time():
    g = synthetic.make("chain", 300)
    budget = activation_budget_bytes(g, 0.3)
    full = FrontierDP(g)
    assert full.solve(budget) is not None
    needed = full.work
    stops = []
    for _ in range(2):
        program = FrontierDP(g)
        with pytest.raises(FrontierTimeout) as info:
            program.solve(budget, max_work=needed // 3)
        assert info.value.by == "work limit"
        stops.append((str(info.value), program.work))
    assert stops[0] == stops[1] and needed // 3 < stops[0][1] < needed
    again = FrontierDP(g)
    assert again.solve(budget, max_work=needed).objective == full.solve(budget).objective and again.work == needed


def test_the_program_stops_at_the_deadline():
    g = synthetic.make("chain", 300)
    with pytest.raises(FrontierTimeout) as info:
        FrontierDP(g).solve(activation_budget_bytes(g, 0.3), deadline=Deadline(1.0, clock=StepClock(5)))
    assert info.value.by == "time limit"


# ------------------------------------------------------------------ one plan space, within its work
def _kept_pays():
    """A repeated-block graph where keeping nodes is strictly cheaper, and the work of both programs."""
    g = synthetic.repeated_blocks(6, 6, seed=2, common=1, saveable=0.7)
    budget = activation_budget_bytes(g, 0.4)
    plain = FrontierDP(g)
    p = plain.solve(budget)
    kept = FrontierDP(g, selective=True)
    k = kept.solve(budget, upper=p.objective)
    assert k.objective < p.objective
    return g, budget, p, plain.work, kept.work


def test_kept_nodes_stopped_by_work_give_the_regions_optimum_and_say_so():
    g, budget, plain, plain_work, kept_work = _kept_pays()
    limit = (plain_work + kept_work // 2) / WORK_PER_S  # the program without kept nodes ends, the other does not
    plans = [solvers.solve(g, budget, solver="ilp", method="frontier", work_limit=limit) for _ in range(2)]
    for plan in plans:
        assert plan.status == "feasible" and plan.bound is None and not plan.saved
        assert plan.findings["optimal_over"] == ilp_mod.REGIONS and plan.recompute_cost == plain.objective
        assert plan.findings["selective"] == ("not searched: the frontier program with kept nodes stopped at its "
                                              "work limit")
    assert plans[0].regions == plans[1].regions
    full = solvers.solve(g, budget, solver="ilp", method="frontier", work_limit=2 * (plain_work + kept_work) / WORK_PER_S)
    assert full.status == "optimal" and full.findings["optimal_over"] == ilp_mod.KEPT and full.saved
    assert full.recompute_cost < plain.objective


def test_method_frontier_is_obeyed_and_cp_sat_runs_only_where_the_program_does_not(monkeypatch):
    g, budget, plain, *_ = _kept_pays()
    model = solvers.cpsat.solver.checkpoint_model()
    monkeypatch.setattr(model, "solve", lambda *a, **k: pytest.fail("CP-SAT ran on a narrow graph"))
    plan = solvers.solve(g, budget, solver="ilp")
    assert plan.findings["method"] == "frontier with kept nodes" and plan.status == "optimal"
    with pytest.raises(IlpTimeout, match="work limit"):
        solvers.solve(g, budget, solver="ilp", method="frontier", work_limit=1e-9)


def test_no_raw_memory_error(monkeypatch):
    g = synthetic.make("residual", 40)
    budget = activation_budget_bytes(g, 0.7)

    def no_memory(*_a, **_k):
        raise MemoryError

    monkeypatch.setattr(FrontierDP, "solve", no_memory)
    monkeypatch.setattr(DPTable, "__init__", no_memory)
    plan = solvers.solve(g, budget, solver="ilp")  # CP-SAT takes over from chen's and uniform's plans
    assert plan.peak_bytes <= budget and "frontier" not in plan.findings["method"]


# ------------------------------------------------------------------ building CP-SAT's model
def test_building_the_model_stops_at_the_deadline():
    model = solvers.cpsat.solver.checkpoint_model()
    g = synthetic.make("unet", 100)
    with pytest.raises(OutOfTime):
        model(g, budget_bytes=activation_budget_bytes(g, 0.5), deadline=Deadline(1.0, clock=StepClock(3)))


# ------------------------------------------------------------------ dp: kernel, memory, work
def test_plain_kernel_is_the_compiled_one(monkeypatch):
    """NOTE [ The dp kernel under a deadline ]: the plain copy fills the very same table."""
    graphs = [synthetic.make("chain", 60), synthetic.make("residual", 40, seed=1),
              synthetic.make("transformer", 40, seed=2), synthetic.mark_saveable(synthetic.make("hetero-chain", 40), 0.6),
              synthetic.repeated_blocks(4, 5, seed=1, saveable=0.5)]
    compiled = [DPTable(g, max_front=None) for g in graphs]
    assert all(t.compiled for t in compiled)
    monkeypatch.setattr(solvers.dp.chain, "kernel", lambda wait: (dp_kernel.plain_kernel(), False))
    for g, want in zip(graphs, compiled):
        got = DPTable(g, max_front=None)
        assert not got.compiled and got._fronts.keys() == want._fronts.keys()
        for key, front in want._fronts.items():
            for name in ("h", "cost", "choice", "nxt"):
                assert np.array_equal(getattr(got._fronts[key], name), getattr(front, name)), (g.name, key, name)


def test_a_deadline_never_waits_for_the_kernel(monkeypatch):
    go, loading = threading.Event(), threading.Event()

    def slow_compile():  # stands for numba's import and a cold compile
        loading.set()
        go.wait()
        dp_kernel._state["compiled"] = dp_kernel.plain_kernel()
        return dp_kernel._state["compiled"]

    monkeypatch.setattr(dp_kernel, "_state", {})
    monkeypatch.setattr(dp_kernel, "_compiled", slow_compile)
    fn, compiled = dp_kernel.kernel(wait=False)
    assert not compiled and fn is dp_kernel.plain_kernel()
    dp_kernel.load_in_background()
    assert loading.wait(60)  # the loader runs in its thread meanwhile
    assert dp_kernel.kernel(wait=False)[1] is False  # still loading: still the plain copy, no wait
    go.set()
    dp_kernel._state["thread"].join(60)
    assert dp_kernel.kernel(wait=False)[1] is True


def test_dp_table_memory_is_linear():
    """NOTE [ Linear memory in dp ]: a 20,000-node chain's table once took 2.98 GiB before its first merge; the
    longest row now holds a few arrays of the chain's length."""
    g = synthetic.make("chain", 20_000)
    table_rows = RegionRows(node_arrays(g, frozenset()), solvers.stages(g))
    tracemalloc.start()
    try:
        l0, cost = table_rows.row(0, len(g) - 1)  # every region starting at the first node
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(l0) == len(cost) == len(g) and peak < 32 * 2**20  # 3.2 GB for one stages x stages array


def test_program_work_does_not_depend_on_earlier_calls():
    g, budget, *_ = _kept_pays()
    program = FrontierDP(g, selective=True)
    works = []
    for _ in range(2):  # the second call finds the block fronts built: it counts them all the same
        program.solve(budget)
        works.append(program.work)
    assert works[0] == works[1]


def test_dp_refuses_a_table_past_its_work_before_filling_it():
    g = synthetic.make("chain", 20_000)
    with pytest.raises(OutOfTime) as info:
        DPTable(g, max_s=1.0)
    assert info.value.by == "work limit"


# ------------------------------------------------------------------ warm starts
def test_warm_starts_are_bounded():
    from solvers.warm import UNIFORM_TRIES, _candidates, uniform_ks

    g = synthetic.make("chain", 5000)
    ks = uniform_ks(len(g))
    assert len(ks) <= UNIFORM_TRIES and ks[0] == 1 and ks[-1] == len(g)
    assert sum(1 for _ in _candidates(g)) <= 2 + 1 + 1 + 48 + UNIFORM_TRIES  # not one per k


def test_warm_starts_skip_dp_past_its_share_of_the_limit(monkeypatch):
    from solvers import warm

    g = synthetic.make("chain", 1500)  # a table of 1.1 million units: above its share of a 1 s limit
    monkeypatch.setattr(DPTable, "_fill", lambda *a, **k: pytest.fail("dp filled past its share"))
    budget = activation_budget_bytes(g, 0.5)
    got = warm.warm_starts(g, budget, Deadline(1.0, clock=StepClock(10**9, 0.0)), work_limit=1.0)
    assert got.best is not None and simulate(g, solvers.Plan(regions=got.best.regions)).peak_bytes <= budget


class HandClock:
    """A clock that stands still until a test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("limit_s", [0.5, 100.0])
def test_a_program_stopped_by_the_clock_leaves_a_plan_where_passes_are_a_large_part_of_the_limit(monkeypatch,
                                                                                                   limit_s):
    # NOTE [ One plan space ]: on a graph whose passes are a large part of the limit the warm starts before dp
    # run before the frontier program, so a program that takes all the time still leaves a plan (a 20,000-node
    # chain at 5 s once had none). With a long limit they run after it, and here nothing is left for them.
    g = synthetic.make("chain", 2000)  # 3 passes of 0.02 s: above a tenth of 0.5 s, below a tenth of 100 s
    budget = activation_budget_bytes(g, 0.3)
    clock = HandClock()

    def takes_all_the_time(self, *_a, **_k):
        clock.now = 2 * limit_s
        raise FrontierTimeout("the frontier program stopped at the time limit")

    monkeypatch.setattr(FrontierDP, "solve", takes_all_the_time)
    monkeypatch.setattr(Deadline, "probe_load", lambda self, *a: None)  # an idle core, whatever the machine
    deadline = Deadline(limit_s, clock=clock)
    if limit_s > 1:
        with pytest.raises(IlpTimeout):
            ilp_mod.solve_within(g, budget, deadline)
        return
    plan = ilp_mod.solve_within(g, budget, deadline)
    assert plan.status == "feasible" and plan.findings["incumbent"] == "chen"
    assert simulate(g, plan, record=False).peak_bytes <= budget


# ------------------------------------------------------------------ what follows a CP-SAT search
def test_a_search_past_its_time_limit_is_stopped_while_the_read_out_is_left(monkeypatch):
    """NOTE [ What follows a search ] (``solvers.cpsat.model``): a search that ignores its own time limit is told
    to stop while what follows it (the read-out, freeing the model) and the grace to stop are left, so when it is
    left running the answer still comes back within the limit. It was told to stop at the deadline itself: a
    20,000-node chain's ``ilp`` at a load of 8 returned 1.6 s past its 60 s limit."""
    from ortools.sat.python import cp_model

    from solvers.cpsat import model as cp_model_mod
    from solvers.cpsat.run import STOP_GRACE_S
    from solvers.cpsat.solver import IlpSolver, warm_start

    g = synthetic.make("chain", 60)
    budget = activation_budget_bytes(g, 0.3)
    inc, _ = warm_start(g, budget)
    assert inc is not None and inc.flops > 0
    clock = HandClock()
    deadline = Deadline(100.0, clock=clock)
    told: list[float] = []

    def runs_past_its_limit(solver, model, callback=None, *, expired=None):  # noqa: ANN001
        if callback is None:  # completing the hint: it gives up at once
            return cp_model.UNKNOWN
        while not expired():  # the search looks at the clock seldom: only the watcher stops it
            clock.now += 0.25
        told.append(deadline.left())
        clock.now += STOP_GRACE_S  # not back within the grace: left running, its answer never read
        return None

    monkeypatch.setattr(cp_model_mod, "run_cp_sat", runs_past_its_limit)
    plan = IlpSolver(g, budget, deadline=deadline, incumbent=inc).solve()
    assert plan.regions == inc.regions and plan.findings["cp_sat_stopped_by"] == "time limit"
    assert told and told[0] >= deadline.read_out_s(len(g)) + STOP_GRACE_S - 0.25
    assert deadline.left() >= deadline.read_out_s(len(g)) - 0.25  # the read-out still has its time


def test_the_knapsack_cuts_stop_at_the_deadline(monkeypatch):
    """NOTE [ What follows a search ]: the knapsack cuts (64 rows: 7 s on a 20,000-node chain, unchecked) are
    made and added row by row, each only while a row's time is left; the rows added and their bound stay valid,
    and the answer is the warm start's plan, with that bound."""
    from solvers.cpsat import cuts
    from solvers.cpsat.solver import IlpSolver, checkpoint_model, warm_start

    g = synthetic.make("chain", 300)
    budget = activation_budget_bytes(g, 0.3)
    rows, bound = cuts.memory_cuts(g, budget)
    assert len(rows) > 3 and bound > 0
    inc, _ = warm_start(g, budget)
    clock = HandClock()
    deadline = Deadline(100.0, clock=clock)
    made: list[int] = []
    real = cuts.iter_memory_cuts

    def slow_rows(graph, budget_bytes):  # noqa: ANN001
        for row in real(graph, budget_bytes):
            made.append(1)
            clock.now += 30.0  # each row takes 30 s of the 100 s limit
            yield row

    model_class = checkpoint_model()
    model_mod = sys.modules[model_class.__module__]
    monkeypatch.setattr(cuts, "iter_memory_cuts", slow_rows)
    monkeypatch.setattr(model_mod, "run_cp_sat", lambda *a, **k: None)  # no search finds anything
    plan = IlpSolver(g, budget, deadline=deadline, incumbent=inc).solve()
    assert len(made) == 3  # rows end at 30, 60 and 90 s: 10 s left is less than a row takes
    assert deadline.left() == pytest.approx(10.0)
    assert plan.regions == inc.regions and plan.findings["cp_sat_stopped_by"] == "time limit"
    assert 0 < plan.bound <= bound
