"""ilp's warm start stays within ilp's own plans when dp keeps nodes.

``dp`` keeps op outputs by default on graphs with keepable nodes (every
traced graph now); ilp searches region-only plans, so its incumbent must be
a region-only plan whose recorded cost is what those regions cost.
"""

from __future__ import annotations

import pytest

from graphs import synthetic
from solvers import InfeasibleBudget, Plan, simulate
from solvers.dp.solver import dp
from solvers.cpsat.solver import warm_start
from solvers.model.simulate import store_all_peak


def _cases():
    for seed in range(40):
        g = synthetic.hetero_chain(12, seed=seed, saveable=0.7)
        top = store_all_peak(g).peak_bytes
        for frac in (0.6, 0.75, 0.9):
            budget = int(top * frac)
            try:
                sel, plain = dp(g, budget), dp(g, budget, selective=False)
            except InfeasibleBudget:
                continue
            if sel.saved and simulate(g, sel).recompute_cost < simulate(g, plain).recompute_cost:
                yield g, budget
                break


def test_incumbent_is_a_region_only_plan_costed_as_such():
    cases = list(_cases())[:3]
    if not cases:
        pytest.skip("no graph where keeping nodes is strictly cheaper")
    for g, budget in cases:
        inc, bound = warm_start(g, budget)
        assert inc is not None
        plain = Plan.from_regions(g, inc.regions)
        assert inc.flops == simulate(g, plain).recompute_cost
        assert bound is None or bound <= inc.flops
