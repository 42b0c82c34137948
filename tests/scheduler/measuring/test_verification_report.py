"""The verification report says by how many bytes a step ran over (issue 33 item 7).

Before, a plan whose step measured 1,024 B over its prediction and 4 B over its budget printed "fits the budget:
NO" beside a peak error of "+0.0%" and a FAIL line without a number: the rounding hid the bytes that failed it.
"""

from scheduler.measuring.verification import Verification


def _verification(budget, predicted, measured):
    return Verification(model="m", solver="ilp", regions=3, budget_bytes=budget, predicted_peak_bytes=predicted,
                        measured_peak_bytes=measured, predicted_store_all_bytes=3_000_000,
                        measured_store_all_bytes=3_000_000, predicted_recompute_ratio=0.1, step_time_ratio=1.1,
                        step_time_s=0.01, max_grad_diff=0.0, loss_diff=0.0, buffers_equal=True)


def test_a_failed_budget_shows_the_bytes_over_and_the_peak_error_in_bytes():
    v = _verification(budget=2_145_000, predicted=2_143_980, measured=2_145_004)
    rows = {name: value for name, value, _ in v.rows()}
    assert not v.fits and v.over_budget_bytes == 4
    assert rows["fits the budget"] == "NO, 4 B over"
    assert rows["peak error (measured vs predicted)"].startswith("+1,024 B (+0.0478")


def test_a_fitting_plan_shows_no_bytes_over():
    v = _verification(budget=2_145_000, predicted=2_145_000, measured=2_144_000)
    rows = {name: value for name, value, _ in v.rows()}
    assert v.fits and v.over_budget_bytes == 0 and rows["fits the budget"] == "yes"
    assert rows["peak error (measured vs predicted)"].startswith("-1,000 B (-0.0466")
    assert _verification(None, 5, 5).rows()[6][1] == "0 B (exact)"
