"""Plans: building by hand, JSON round trip, fingerprints, errors; the baselines."""

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs import Node, synthetic
from solvers import (InfeasibleBudget, Plan, PlanError, PlanMismatch, Status, UnknownSolver, load_plan, simulate,
                     solve)


def test_from_regions_and_json_round_trip(tmp_path):
    g = synthetic.transformer(40)
    plan = Plan.from_regions(g, [(14, 25), (2, 13)])
    assert plan.regions == ((2, 13), (14, 25)) and plan.status == Status.MANUAL
    assert plan.node_names == (("n2", "n13"), ("n14", "n25"))
    plan.save(tmp_path / "p.json")
    back = load_plan(tmp_path / "p.json")
    assert back == plan
    back.check_graph(g)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=6),
       st.sampled_from(Status.ALL), st.one_of(st.none(), st.floats(0, 1e12, allow_nan=False)))
def test_plan_json_round_trip_hypothesis(spans, status, bound):
    regions, nxt = [], 0
    for start, length in spans:
        a = nxt + start
        regions.append((a, a + length))
        nxt = a + length + 1
    plan = Plan(regions=tuple(regions), status=status, bound=bound, solver="x", options={"k": 3, "t": 1.5},
                budget_bytes=123, peak_bytes=100, recompute_flops=7, fingerprint="abc")
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


@pytest.mark.parametrize("regions,msg", [
    ([(3, 1)], "need 0 <= first <= last"), ([(-1, 2)], "need 0 <= first"), ([(0, 4), (4, 6)], "overlap"),
    ([(0, 99)], "ends past the last node"), ([(0,)], "pair"), ([(0.5, 2)], "integers"),
])
def test_bad_regions(regions, msg):
    with pytest.raises(PlanError, match=msg):
        Plan.from_regions(synthetic.chain(10), regions)


def test_not_recomputable_node_cannot_be_in_a_region():
    g = synthetic.chain(4)
    g = g.with_nodes([dataclasses.replace(n, recomputable=(n.name != "n2")) for n in g.nodes])
    with pytest.raises(PlanError, match="not recomputable"):
        Plan.from_regions(g, [(1, 3)])


def test_plan_for_another_graph_is_refused_with_the_difference():
    small = synthetic.transformer(40)
    plan = Plan.from_regions(small, [(2, 13)])
    other = small.with_nodes(small.nodes, meta={**small.meta, "n": 80})
    with pytest.raises(PlanMismatch, match="n 40 vs 80"):
        plan.check_graph(other)


@pytest.mark.parametrize("data,msg", [
    ({"format": 7, "regions": []}, "format version 7"), ({}, "'regions'"), ({"regions": [], "colour": 1}, "unknown field"),
    ({"regions": [[1, 2, 3]]}, "pairs"),
])
def test_bad_plan_json(tmp_path, data, msg):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=msg):
        load_plan(path)


def test_missing_and_broken_plan_files(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(tmp_path / "nope.json")
    (tmp_path / "b.json").write_text("[")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(tmp_path / "b.json")


def test_store_all_and_uniform_baselines():
    g = synthetic.chain(16)
    peak = simulate(g).peak_bytes
    plan = solve(g, peak, solver="store-all")
    assert plan.regions == () and plan.recompute_flops == 0 and plan.peak_bytes == peak
    with pytest.raises(InfeasibleBudget) as err:
        solve(g, peak - 1, solver="store-all")
    assert err.value.min_feasible_bytes == peak and "least feasible budget" in str(err.value)
    four = solve(g, peak, solver="uniform", k=4)
    assert len(four.regions) == 3 and four.options["k"] == 4  # the last segment runs normally
    tight = solve(g, int(peak * 0.7), solver="uniform")
    assert tight.peak_bytes <= int(peak * 0.7) and tight.peak_bytes == simulate(g, tight).peak_bytes
    assert tight.recompute_flops == simulate(g, tight).recompute_flops > 0


def test_unknown_solver():
    with pytest.raises(UnknownSolver, match="unknown solver 'magic'"):
        solve(synthetic.chain(3), 10**9, solver="magic")
