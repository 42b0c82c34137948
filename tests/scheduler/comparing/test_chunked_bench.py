"""The step-time comparison of benchmarks/chunked.py (issue 25): what runs when, and what is reported.

A fake clock stands in for time: no clock is asserted on.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.chunked import CnnCase, Side, StepRatio, _missing, _nested_cells, cnn_lines, compare_steps


class _Bench:
    """A step whose duration depends on which side is installed, a clock that advances by it, and a log."""

    def __init__(self, seconds: dict[str, list[float]]) -> None:
        self.seconds = {k: list(v) for k, v in seconds.items()}
        self.now, self.on, self.log = 0.0, None, []

    def side(self, name: str) -> Side:
        def on() -> None:
            assert self.on is None, "a side was installed over another"
            self.on = name
            self.log.append(f"+{name}")

        def off() -> None:
            assert self.on == name
            self.on = None
            self.log.append(f"-{name}")

        return Side(on, off)

    def step(self) -> None:
        assert self.on is not None, "a step ran with no side installed"
        self.now += self.seconds[self.on].pop(0)
        self.log.append(self.on)

    def clock(self) -> float:
        return self.now


def test_sides_alternate_abba_and_each_is_removed_after_its_turn():
    bench = _Bench({"theirs": [9.0] * 9, "ours": [9.0] * 9})
    compare_steps(bench.step, bench.side("theirs"), bench.side("ours"), 3, timed=2, clock=bench.clock)
    turns = [e[1:] for e in bench.log if e.startswith("+")]
    assert turns == ["theirs", "ours", "ours", "theirs", "theirs", "ours"]
    assert bench.on is None
    # each turn: install, one warm-up and two timed steps, remove
    assert bench.log[:5] == ["+theirs", "theirs", "theirs", "theirs", "-theirs"]


def test_ratio_is_the_median_of_pairs_each_side_its_fastest_timed_step():
    # per turn: warm-up (ignored), then two timed steps of which the fastest counts
    theirs = [100.0, 4.0, 5.0, 100.0, 2.0, 2.0, 100.0, 8.0, 4.0]  # pair bests 4, 2, 4
    ours = [100.0, 3.0, 9.0, 100.0, 3.0, 3.0, 100.0, 2.0, 2.0]  # pair bests 3, 3, 2
    bench = _Bench({"theirs": theirs, "ours": ours})
    got = compare_steps(bench.step, bench.side("theirs"), bench.side("ours"), 3, timed=2, clock=bench.clock)
    assert got == StepRatio(median=0.75, low=0.5, high=1.5, pairs=3)
    assert str(got) == "0.75 (0.50-1.50)"


def test_threads_restored_and_side_removed_when_a_step_fails():
    before = torch.get_num_threads()
    bench = _Bench({"theirs": [], "ours": []})  # the first step finds no duration: IndexError
    with pytest.raises(IndexError):
        compare_steps(bench.step, bench.side("theirs"), bench.side("ours"), 2, threads=1, clock=bench.clock)
    assert bench.on is None and torch.get_num_threads() == before


def test_nested_column_appears_only_with_a_nested_budget():
    rows = [dict(nested=None, theirs=100)]
    assert _nested_cells(rows)[0] == ""
    rows.append(dict(nested=40, theirs=100, nested_measured=38, nested_inner=3))
    head, rule, cell = _nested_cells(rows)
    assert "nesting" in head and rule == "---|"
    assert cell(rows[0]) == " - |" and cell(rows[1]) == " 40 B (0.40) / 38 B (3) |"


def _cnn_row(**over):
    row = dict(model="resnet-26", what="a ResNet", batch=8, theirs=200, least=180, predicted=180, measured=170,
               predicted_theirs=195, measured_theirs=190, largest=8, time_ratio=StepRatio(0.9, 0.8, 1.1, 11),
               recomputed=0.38, their_recomputed=0.82, nested=None)
    return {**row, **over}


def test_cnn_section_names_a_case_not_run_and_what_each_gains():
    lines = cnn_lines([_cnn_row(), _cnn_row(model="densenet-121", batch=4, largest=8),
                       dict(model="other", skipped="torchvision does not import here")], 64)
    table = [ln for ln in lines if ln.startswith("| resnet-26") or ln.startswith("| densenet-121")]
    assert len(table) == 2 and table[0].endswith("| 0.38 / 0.82 | 8 | 0.90 (0.80-1.10) |")
    assert "Not measured: other: torchvision does not import here." in lines
    gains = lines[-1]
    assert "resnet-26, a least budget 10% below their peak, no larger batch" in gains
    assert "densenet-121, a least budget 10% below their peak, batch 8 at their peak" in gains
    assert "| other" not in "\n".join(lines)


def test_a_case_whose_package_does_not_import_is_skipped_saying_which():
    case = CnnCase("x", lambda b: None, lambda m: None, lambda m: [], 1, "dp", "x", needs=("no_such_package_ckpt",))
    assert _missing(case).startswith("no_such_package_ckpt does not import here (ModuleNotFoundError")
    assert _missing(CnnCase("y", lambda b: None, lambda m: None, lambda m: [], 1, "dp", "y")) is None
