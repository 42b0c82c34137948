"""``time_steps`` runs the two steps in ABBA order."""

from scheduler.measuring.steps import time_steps


def test_time_steps_alternates_abba():
    calls = []
    time_steps(lambda: calls.append("s"), lambda: calls.append("r"), repeats=4)
    assert calls == ["r", "s", "s", "r", "r", "s", "s", "r"]
    # Not always the reference right before the step: each also runs right after itself.
    after = list(zip(calls, calls[1:]))
    assert ("s", "s") in after and ("r", "r") in after
