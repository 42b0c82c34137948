"""The time page's own arithmetic (``benchmarks.time_truth``): the statistics it judges the cost model by."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from benchmarks import time_truth


def test_quartiles_bracket_the_middle_half():
    lo, hi = time_truth.quartiles([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (lo, hi) == (2.0, 4.0)
    assert time_truth.quartiles([7.0]) == (7.0, 7.0)
    assert all(math.isnan(v) for v in time_truth.quartiles([]))


def test_kendall_tau_of_agreeing_and_reversed_orders():
    assert time_truth.kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert time_truth.kendall_tau([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert time_truth.kendall_tau([1], [1]) is None


def _row(label, predicted, measured, spread, step=1.1, budget=1, plan=None):
    plan = plan or SimpleNamespace(regions=((len(label), len(label)),), saved=(), chunks=(label,))
    return dict(budget=budget, label=label, plan=plan, predicted=predicted, measured=measured, spread=spread,
                step=step, plain=1.0)


def _result(model, rows, ratio):
    return dict(model=model, rows=rows, wall=(ratio, ratio, ratio), plain_s=1.0, their_extra=0.2, our_extra=0.1,
                our_peak=1, their_peak=2)


def test_goals_say_whether_the_prediction_lies_inside_the_rounds():
    rows = [_row("pick: ilp", 0.010, 0.012, (0.008, 0.013)), _row("dp", 0.020, 0.030, (0.025, 0.035)),
            _row("chen", 0.001, 0.001, (0.0, 0.002))]
    line = time_truth.goals([_result("gpt2", rows, 0.9)])[0]
    # the median measured candidate is the pick: -17 %, not within 15 %, but inside its rounds' quartiles
    assert "-17 % (NOT held within 15 %" in line
    assert "8.0-13.0 ms, the prediction 10.0 ms inside them" in line
    assert "goal <= 0.95 on LMs: held" in line
    rows[0]["spread"] = (0.011, 0.013)
    assert "outside them" in time_truth.goals([_result("gpt2", rows, 0.9)])[0]


def test_a_vision_model_is_judged_against_their_step():
    rows = [_row("pick: ilp", 0.010, 0.010, (0.009, 0.011))]
    assert "(goal < 1: NOT held)" in time_truth.goals([_result("convnext", rows, 1.01)])[0]
    assert "(goal < 1: held)" in time_truth.goals([_result("resnet", rows, 0.84)])[0]


def test_a_plan_both_budgets_list_counts_once_in_tau_and_the_median():
    same = SimpleNamespace(regions=((0, 3),), saved=(), chunks=())
    rows = [_row("pick: ilp", 0.030, 0.030, (0.02, 0.04), budget=2, plan=same),
            _row("dp", 0.020, 0.010, (0.0, 0.02), budget=2),
            _row("pick: ilp", 0.030, 0.030, (0.02, 0.04), budget=1, plan=same),
            _row("chen", 0.001, 0.002, (0.0, 0.004), budget=1)]
    s = time_truth.summarise(_result("gpt2", rows, 0.9))
    assert s["distinct"] == 3
    assert s["median"]["label"] == "dp"  # of three plans, the middle; counted twice, the pick would be
    assert s["tau"] == pytest.approx(1.0)
