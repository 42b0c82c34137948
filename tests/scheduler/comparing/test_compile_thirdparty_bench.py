"""benchmarks/compile_thirdparty.py: the compiled bound against inductor's measured peak, and its page."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import compile_thirdparty
from benchmarks.thirdparty_models import Case


def _mlp_case() -> Case:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.GELU(),
                             nn.Linear(64, 5))

    def inputs():
        torch.manual_seed(1)
        return (torch.randn(128, 32),), {}, torch.randint(0, 5, (128,))

    return Case("torch", build, inputs, lambda out, y: F.cross_entropy(out, y), lambda m, _: m)


def test_a_model_is_measured_compiled_unplanned_and_planned_each_at_or_under_its_bound():
    row = compile_thirdparty.run_case("mlp", _mlp_case())
    assert row["regions"] >= 1
    for side in ("unplanned", "planned"):
        x = row[side]
        assert "error" not in x, x
        assert x["guaranteed"] and x["graphs"] == 1 and x["eager_nodes"] == 0
        assert 0 < x["measured"] <= x["bound"], (side, x)
    page = compile_thirdparty.report([row], ["other: skipped, lib is not installed"])
    assert "**2 of 2 compiled steps at or under their bound (2 of the 2 where it is proven)" in page
    assert "| mlp | planned |" in page and "- other: skipped" in page


def _side(bound: int, measured: int, guaranteed: bool = True) -> dict:
    return {"bound": bound, "fused": bound // 2, "layout": 0 if guaranteed else 2**20, "graphs": 1,
            "eager_nodes": 0, "guaranteed": guaranteed, "measured": measured}


def test_the_page_names_every_step_over_its_bound_and_whether_the_bound_was_proven_there():
    rows = [{"model": "a", "regions": 2, "unplanned": _side(100 * 2**20, 50 * 2**20),
             "planned": _side(40 * 2**20, 44 * 2**20, guaranteed=False)},
            {"model": "b", "regions": 1, "unplanned": _side(10 * 2**20, 11 * 2**20),
             "planned": {"error": "RuntimeError: boom"}},
            {"model": "c", "error": "ValueError: no trace"}]
    page = compile_thirdparty.report(rows, [])
    assert "**1 of 3 compiled steps at or under their bound (1 of the 2 where it is proven); measured/bound " \
           "0.500 to 1.100.**" in page
    assert "- a planned: 4.00 MiB over (layout copies counted, not proven" in page
    assert "- b unplanned: 1.00 MiB over (proven: a defect of the bound" in page
    assert "| b | planned | 1 | - | - | - | - | - | **failed** |" in page and "- b planned: **failed**: RuntimeError" in page
    assert "- c: **failed**: ValueError: no trace" in page
