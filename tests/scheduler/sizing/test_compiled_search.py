"""scheduler/sizing/compiled.py: the compile-aware budget (NOTE [ Compile-aware budget ]) with made-up plans and
an injected measure: no compile, no clock."""

from __future__ import annotations

import pytest

from scheduler.sizing.compiled import Search
from solvers.errors import InfeasibleBudget

MIB = 2**20


class Menu:
    """Plans 0..n-1, each checkpointing more than the one before: plan k's eager prediction falls with k, and
    what inductor measures is ``ratios[k]`` of it (far under the prediction with little checkpointing, near it
    with much). ``solve`` returns the cheapest plan whose prediction is within the budget."""

    def __init__(self, predicted_mib: list[float], ratios: list[float]) -> None:
        self.predicted = [int(p * MIB) for p in predicted_mib]
        self.ratios = ratios
        self.compiled: list[int] = []
        self.solved: list[int] = []

    @property
    def floor(self) -> int:
        return self.predicted[-1]

    def solve(self, budget: int) -> int:
        self.solved.append(budget)
        if budget < self.floor:
            raise InfeasibleBudget(budget, self.floor)
        return next(k for k, p in enumerate(self.predicted) if p <= budget)

    def measure(self, k: int) -> int:
        self.compiled.append(k)
        return int(self.predicted[k] * self.ratios[k])

    def search(self, plain: bool = True) -> Search:
        return Search(self.solve, self.measure, lambda k: self.predicted[k], key=lambda k: k, cost=lambda k: k,
                      plain=(self.predicted[0], self.measure(0)) if plain else None)


def llama_like() -> Menu:
    # plan 0 is the unplanned step: predicted 26, measured 17.2 (0.66); the floor's plan predicted 20.5
    return Menu([26.0, 24.0, 22.0, 20.5], [0.66, 0.70, 0.80, 0.85])


def test_below_the_floor_the_floors_plan_is_measured_not_nothing():
    menu = llama_like()
    fit = menu.search().fit(int(15.0 * MIB))  # under the floor (20.5) and under what the floor's plan measures
    assert fit.floor == menu.floor
    assert fit.point is not None and fit.point.plan == 3  # the least-peak plan, measured
    assert fit.at_floor and not fit.reached
    assert fit.point.measured == int(20.5 * 0.85 * MIB)


def test_below_the_floor_in_eager_terms_the_floors_plan_can_still_reach_the_target():
    menu = Menu([26.0, 24.0, 22.0, 20.5], [0.66, 0.70, 0.80, 0.80])
    target = int(16.6 * MIB)  # under our eager floor, over what inductor measures of the floor's plan (16.4)
    fit = menu.search().fit(target)
    assert fit.reached and fit.point.plan == 3
    assert fit.point.measured <= target < menu.floor


def test_the_search_lands_on_the_fastest_plan_measured_at_or_under_the_target():
    # a GPT-2-like menu: light plans measure far under their prediction, so the first guess from the target
    # alone (a plan predicted at 16) wastes memory that a lighter plan measured at 15.6 would use
    menu = Menu([29.0, 26.0, 23.0, 20.0, 17.0, 14.5], [0.67, 0.68, 0.68, 0.75, 0.92, 0.99])
    target = int(16.0 * MIB)
    fit = menu.search().fit(target, compiles=4)
    fitting = [k for k in range(6) if int(menu.predicted[k] * menu.ratios[k]) <= target]
    assert fit.reached and fit.point.plan == min(fitting) == 2
    assert fit.point.measured <= target
    assert fit.compiles <= 4 and len(set(menu.compiled)) == len(menu.compiled)  # no plan compiled twice


def test_points_carry_over_between_targets_and_a_known_plan_is_not_compiled_again():
    menu = Menu([29.0, 26.0, 23.0, 20.0, 17.0, 14.5], [0.67, 0.68, 0.68, 0.75, 0.92, 0.99])
    search = menu.search()
    first = search.fit(int(16.0 * MIB))
    before = list(menu.compiled)
    again = search.fit(int(16.2 * MIB))  # brackets already known: the same plan, nothing compiled
    assert again.point.plan == first.point.plan
    assert menu.compiled == before and again.compiles == 0


def test_over_the_unplanned_peak_no_plan_is_needed_and_the_cheapest_plan_is_kept():
    menu = llama_like()
    fit = menu.search().fit(int(30.0 * MIB))
    assert fit.reached and fit.point.plan == 0 and not fit.at_floor


@pytest.mark.parametrize("compiles", [1, 2])
def test_the_compile_allowance_is_kept(compiles):
    menu = Menu([29.0, 26.0, 23.0, 20.0, 17.0, 14.5], [0.67, 0.68, 0.68, 0.75, 0.92, 0.99])
    search = menu.search()
    start = len(menu.compiled)
    fit = search.fit(int(16.0 * MIB), compiles=compiles)
    assert len(menu.compiled) - start == fit.compiles <= compiles
    assert fit.point is not None


def test_a_target_searched_early_gets_the_better_plan_a_later_search_measured():
    menu = Menu([29.0, 26.0, 23.0, 20.0, 17.0, 14.5], [0.67, 0.68, 0.68, 0.75, 0.92, 0.99])
    search = menu.search(plain=False)  # no unplanned point: the first guess is the target itself
    early = search.fit(int(16.0 * MIB), compiles=1)  # one compile: plan 5 (14.4 MiB measured)
    assert early.point.plan == 5
    search.fit(int(15.7 * MIB), compiles=4)  # its search measures lighter plans
    assert search.pick(early).point.plan == 4 and early.reached  # 15.6 MiB measured, less recompute than 5


def test_when_the_floors_plan_is_over_another_solvers_least_peak_plan_is_measured_once():
    menu = llama_like()  # our floor's plan measures 17.4 MiB
    asked = []

    def other_floor() -> str:
        asked.append(1)
        return "other"  # another solver's least-peak plan: predicted 21 MiB, measured 14.7

    def measure(plan):
        return int(14.7 * MIB) if plan == "other" else menu.measure(plan)

    search = Search(menu.solve, measure, lambda k: int(21.0 * MIB) if k == "other" else menu.predicted[k],
                    key=lambda k: k, cost=lambda k: 9 if k == "other" else k,
                    plain=(menu.predicted[0], int(menu.predicted[0] * 0.66)), others=[("floor plan", other_floor)])
    fit = search.fit(int(15.0 * MIB))
    assert fit.point.plan == "other" and fit.reached and fit.at_floor and fit.label == "floor plan"
    again = search.fit(int(14.0 * MIB))
    assert asked == [1] and not again.reached and again.point.plan == "other"  # measured once, the lowest kept


def test_a_labelled_plan_of_no_solver_is_measured_and_named_when_it_is_kept():
    menu = llama_like()
    search = Search(menu.solve, lambda k: int(15.5 * MIB) if k == "coarse" else menu.measure(k),
                    lambda k: int(22.0 * MIB) if k == "coarse" else menu.predicted[k], key=lambda k: k,
                    cost=lambda k: 5 if k == "coarse" else k, plain=(menu.predicted[0], int(menu.predicted[0] * 0.66)),
                    others=[("coarse plan", lambda: "coarse")])
    fit = search.fit(int(16.0 * MIB))  # under the floor's plan (17.4): the coarse plan (15.5) fits
    assert fit.point.plan == "coarse" and fit.reached and fit.label == "coarse plan" and not fit.at_floor
