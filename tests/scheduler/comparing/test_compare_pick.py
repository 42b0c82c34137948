"""How ``ckpt compare`` picks and de-duplicates plans, re-solves below a peer's peak, and keeps peers
installed for their own calls only. No clock is asserted on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scheduler.comparing import peers
from scheduler.comparing.choosing import pick_key, plan_key, solve_below
from scheduler.comparing.rows import Row
from scheduler.comparing.run import Workload, _Bench
from solvers import Plan


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def _wrapped(model: Stack) -> list[bool]:
    return ["forward" in vars(b) for b in model.blocks]


def test_pick_key_prefers_the_solvers_objective_over_flops():
    cheap_flops = Plan(regions=((0, 1),), peak_bytes=100, recompute_flops=10, recompute_cost=500)
    cheap_cost = Plan(regions=((2, 3),), peak_bytes=120, recompute_flops=50, recompute_cost=200)
    assert min([cheap_flops, cheap_cost], key=pick_key) is cheap_cost
    # equal cost: the lower predicted peak
    low = Plan(regions=((0, 3),), peak_bytes=90, recompute_flops=50, recompute_cost=200)
    assert min([cheap_cost, low], key=pick_key) is low
    # a plan without a cost falls back to its FLOPs
    assert pick_key(Plan(regions=(), peak_bytes=5, recompute_flops=7)) == (7, 5)


def test_plan_key_tells_kept_nodes_apart():
    a = Plan(regions=((0, 3),))
    b = Plan(regions=((0, 3),), saved=(1,))
    assert plan_key(a) != plan_key(b)
    assert plan_key(a) == plan_key(Plan(regions=((0, 3),)))


def test_solve_below_lowers_the_budget_until_ours_fits():
    measured = {1000: 1100, 900: 1010, 810: 990}  # budget -> measured peak
    budgets = []

    def run(budget: int, row: Row) -> Row:
        budgets.append(budget)
        peak = measured.get(budget, budget)
        return Row("dp", "ours", measured_peak_bytes=peak, note="optimal")

    got = solve_below(run, 1000, Row("dp", "ours"))
    assert got.measured_peak_bytes <= 1000
    assert budgets[0] == 1000 and budgets == sorted(budgets, reverse=True) and len(budgets) >= 2
    assert "re-solved" in got.note


def test_solve_below_stops_on_infeasible_and_reports_after_too_many_tries():
    got = solve_below(lambda b, r: Row("dp", "ours", reason="infeasible"), 1000, Row("dp", "ours"))
    assert got.reason == "infeasible"
    calls = []
    got = solve_below(lambda b, r: (calls.append(b), Row("dp", "ours", measured_peak_bytes=5000))[1], 1000,
                      Row("dp", "ours"), tries=3)
    assert len(calls) == 3 and "still above" in got.note


def test_per_block_is_installed_only_around_its_own_step():
    torch.manual_seed(0)
    model = Stack().train()
    prep = peers.per_block(model)
    assert _wrapped(model) == [False] * 3
    seen = []
    step = prep.on(lambda: seen.append(_wrapped(model)))
    step()
    assert seen == [[True] * 3] and _wrapped(model) == [False] * 3
    with pytest.raises(RuntimeError):
        prep.on(lambda: (_ for _ in ()).throw(RuntimeError("boom")))()
    assert _wrapped(model) == [False] * 3  # removed even when the step raises


def test_the_reference_is_never_timed_with_the_peer_installed():
    torch.manual_seed(0)
    model = Stack().train()
    x = torch.randn(4, 16)
    bench = _Bench(Workload("stack", model, (x,)), repeats=2, warmup=1)
    plain = bench.reference
    states = []

    def reference():
        states.append(_wrapped(model))
        return plain()

    bench.reference = reference
    row, _ = bench.measure(peers.per_block(model), Row("per-block", "peer"))
    assert states and all(s == [False] * 3 for s in states)
    assert _wrapped(model) == [False] * 3
    assert row.grad_max_abs_diff == 0.0 and row.measured_extra_s is not None


def test_solve_below_also_keeps_the_profiler_peak_under_the_peers():
    # storage count fits at once, the profiler peak only after one more solve
    def run(budget: int, row: Row) -> Row:
        return Row("dp", "ours", measured_peak_bytes=budget + 300_000, meter_peak_bytes=budget)

    got = solve_below(run, 10_000_000, Row("dp", "ours"), metered=True, measured_target=10_100_000)
    assert got.meter_peak_bytes <= 10_000_000 and got.measured_peak_bytes <= 10_100_000
