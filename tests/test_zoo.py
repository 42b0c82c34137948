"""Models nobody here wrote (transformers architectures) through the whole loop.

Each is traced with its own loss, solved with ``ilp`` at 40 % of its
store-all activation peak, applied, and run for a real step: the plan must fit
as measured, and gradients, loss and buffers must be bitwise those of the
step without it. ``benchmarks/zoo.py`` runs the full list.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package lives beside the sources

from benchmarks.zoo import run_one  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "bart", "vit", "resnet"])
def test_zoo_model_fits_and_keeps_gradients(name):
    row = run_one(name, time_limit_s=10)
    assert row["regions"] > 0, row  # the budget made it checkpoint something
    assert row["measured_peak"] <= row["budget_bytes"], row
    assert row["predicted_peak"] <= row["budget_bytes"], row
    assert row["max_grad_diff"] == 0 and row["loss_diff"] == 0 and row["buffers_equal"], row
