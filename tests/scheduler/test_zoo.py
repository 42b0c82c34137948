"""Models nobody here wrote (transformers architectures) through the whole loop.

Each is traced with its own loss, solved with ``ilp`` at 40 % of its
store-all activation peak, applied onto the model itself, and run for a real
step: the plan must fit its prediction (live tensor storages) and, where we
claim it, the allocator's peak; gradients, loss and buffers must be bitwise
those of the user's eager step without it. ``benchmarks/zoo.py`` runs the
full list.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("transformers")
from benchmarks.zoo import run_one  # noqa: E402  (after the skip; the root is on pytest's pythonpath)

MODELS = ["bert", "opt", "bart", "vit", "resnet"]


@functools.lru_cache(maxsize=None)
def row(name: str) -> dict:
    return run_one(name, time_limit_s=10)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_fits_its_prediction_and_keeps_gradients(name):
    r = row(name)
    assert r["regions"] > 0, r  # the budget made it checkpoint something
    assert r["counted_peak"] <= r["predicted_peak"] <= r["budget_bytes"], r
    assert r["max_grad_diff"] == 0 and r["loss_diff"] == 0 and r["buffers_equal"], r
    assert abs(r["store_all_error_pct"]) <= 2.0 or r["architecture"].startswith("ResNet"), r


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_zoo_plan_fits_the_allocator(name):
    """By the allocator's peak too: what kernels allocate inside their calls (NOTE [ Op workspaces ]) and
    the generator state of stochastic regions (NOTE [ RNG state per region ]) are in the prediction."""
    r = row(name)
    assert r["measured_peak"] <= r["budget_bytes"], r
