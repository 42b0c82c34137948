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


def test_with_steps_timed_the_fastest_plan_that_fits_is_kept_not_the_least_predicted_recompute():
    # inductor does not time plans as our eager cost does: a small Llama's plan of 4 regions (the least recompute
    # predicted at compile@0.7's peak) ran at 25.6 ms compiled, its MLPs as regions at 22.8
    menu = Menu([29.0, 26.0, 23.0, 20.0, 17.0, 14.5], [0.67, 0.68, 0.68, 0.75, 0.92, 0.99])
    times = {0: 20.0, 1: 21.0, 2: 26.0, 3: 23.0, 4: 24.0, 5: 25.0}
    search = Search(menu.solve, lambda k: (menu.measure(k), times[k] / 1e3), lambda k: menu.predicted[k],
                    key=lambda k: k, cost=lambda k: k, plain=(menu.predicted[0], int(menu.predicted[0] * 0.67)))
    search.fit(int(15.0 * MIB), compiles=6, solves=8)  # a lower target first: its plans fit the next one too
    fit = search.fit(int(16.0 * MIB), compiles=6, solves=8)
    measured = {p.plan: p for p in search.points if p.plan is not None}
    fitting = [k for k, p in measured.items() if p.measured <= int(16.0 * MIB)]
    assert len(fitting) >= 2, fit.tries  # a choice to make
    assert fit.point.plan == min(fitting, key=times.get) and fit.point.time_s == times[fit.point.plan] / 1e3
    assert fit.point.plan != min(fitting)  # not the least predicted recompute
    # without times (a measure that returns the peak alone) the least predicted recompute is kept, as before
    untimed = menu.search()
    untimed.fit(int(15.0 * MIB), compiles=6, solves=8)
    plain = untimed.fit(int(16.0 * MIB), compiles=6, solves=8)
    assert plain.point.time_s is None and plain.point.plan == min(p.plan for p in untimed.points
                                                                    if p.plan is not None and p.measured <= 16 * MIB)


def test_candidates_are_measured_once_at_the_first_target_beside_the_compile_allowance():
    menu = llama_like()
    made = []

    def family() -> str:
        made.append(1)
        return "mlps"  # measured 14.2 MiB, the fastest

    def measure(k):
        return (int(14.2 * MIB), 0.0228) if k == "mlps" else (menu.measure(k), 0.030)

    search = Search(menu.solve, measure, lambda k: int(21.0 * MIB) if k == "mlps" else menu.predicted[k],
                    key=lambda k: k, cost=lambda k: 9 if k == "mlps" else k,
                    plain=(menu.predicted[0], int(menu.predicted[0] * 0.66)), candidates=[("each layers.*.mlp", family)])
    first = search.fit(int(14.3 * MIB), compiles=1)
    assert first.point.plan == "mlps" and first.reached and first.label == "each layers.*.mlp"
    assert first.compiles == 2 and len(menu.compiled) == 1  # the candidate, and one compile of the search's
    again = search.fit(int(16.0 * MIB), compiles=1)
    assert made == [1] and again.point.plan == "mlps"  # measured once; the fastest that fits the next target too


def test_module_families_are_the_repeated_calls_that_cover_the_most_nodes():
    import torch
    from torch import nn

    import scheduler
    from scheduler.sizing.compiled import family_plans, module_families

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
            self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))

        def forward(self, x):
            return x + self.mlp(x + self.attn(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(3))
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x).sum()

    graph = scheduler.trace(Net(), (torch.randn(8, 16),))
    found = module_families(graph, limit=3)
    spans = {sp.module: (sp.first, sp.last) for sp in graph.spans}
    assert found[0] == ("layers.*", [spans[f"layers.{i}"] for i in range(3)])
    assert found[1] == ("layers.*.mlp", [spans[f"layers.{i}.mlp"] for i in range(3)])
    covered = [sum(b - a + 1 for a, b in regions) for _, regions in found]
    assert covered == sorted(covered, reverse=True) and len(found) == 3
    assert len({tuple(r) for _, r in found}) == 3  # no two alike
    (label, make), = family_plans(graph, limit=1)
    assert label == "each layers.*" and make().modules == tuple(f"layers.{i}" for i in range(3))


def test_inductor_costs_price_the_recompute_of_fused_calls_only_and_keep_the_plan_meaning():
    import torch
    from torch import nn

    import scheduler
    from scheduler.sizing.compiled import FUSED_RECOMPUTE, KERNEL_OPS, inductor_costs

    net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8))
    graph = scheduler.trace(net, (torch.randn(16, 32),))
    fused = inductor_costs(graph)
    assert fused.fingerprint() == graph.fingerprint()  # a plan solved on it applies to the model as traced
    kernels = 0
    for before, after in zip(graph.nodes, fused.nodes):
        if any(op in call for call in before.dispatch for op in KERNEL_OPS):
            kernels += 1
            assert after.fwd_cost == before.fwd_cost and before.fwd_cost > 0, before
        else:
            assert after.fwd_cost == int(before.fwd_cost * FUSED_RECOMPUTE), before
    assert kernels == 2  # the two linears' GEMMs
    assert sum(n.fwd_cost for n in fused.nodes) < sum(n.fwd_cost for n in graph.nodes)


def test_kernel_plans_keep_the_kernels_of_the_outermost_calls_less_the_cheapest_per_byte():
    import torch
    from torch import nn

    import scheduler
    from scheduler.sizing.compiled import KERNEL_OPS, kernel_plans, outer_regions

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
            self.body = nn.Sequential(nn.Conv2d(16, 16, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(32, 32, 3, padding=1), nn.Tanh())
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return self.head(self.body(self.stem(x)).mean((2, 3)))

    class Step(nn.Module):  # the model one call of the step, as the compile page wraps it
        def __init__(self) -> None:
            super().__init__()
            self.m = Net()

        def forward(self, x):
            return self.m(x).square().mean()

    torch.manual_seed(0)
    model, x = Step().train(), torch.randn(4, 3, 16, 16)
    graph = scheduler.trace(model, (x,))
    spans = {sp.module: (sp.first, sp.last) for sp in graph.spans}
    assert outer_regions(graph) == [spans["m"]]
    plans = [(label, make()) for label, make in kernel_plans(graph)]
    assert [label for label, _ in plans] == ["outermost calls, kernels kept"] + [
        f"outermost calls, kernels kept less the cheapest {p} of their bytes" for p in ("25%", "50%")]
    nodes = graph.nodes

    def kernel(i):
        return any(op in call for call in nodes[i].dispatch for op in KERNEL_OPS)

    kept = [set(plan.saved) for _, plan in plans]
    assert all(plan.regions == ((spans["m"]),) for _, plan in plans)
    assert kept[0] and all(kernel(i) for i in kept[0])
    assert kept[0] > kept[1] > kept[2]  # each leaves out more
    per_byte = {i: nodes[i].fwd_cost / nodes[i].out_bytes for i in kept[0]}
    for k in (1, 2):  # what is left out costs least to recompute per byte of what was kept
        assert max(per_byte[i] for i in kept[0] - kept[k]) <= min(per_byte[i] for i in kept[k])
    total = sum(nodes[i].out_bytes for i in kept[0])
    assert sum(nodes[i].out_bytes for i in kept[0] - kept[2]) >= total / 2
    # applied, each steps to the unplanned model's gradients and BatchNorm statistics
    import copy

    ref = copy.deepcopy(model)
    ref(x).backward()
    for _, plan in plans:
        planned = copy.deepcopy(model)
        scheduler.apply(planned, plan)
        planned(x).backward()
        for (n, p), q in zip(planned.named_parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, atol=1e-6), n
        assert torch.equal(planned.m.stem[1].running_mean, ref.m.stem[1].running_mean)
        assert int(planned.m.stem[1].num_batches_tracked) == 1
