"""benchmarks/levers.py: every lever on a model, measured by the allocator; its gradient comparison and its page."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import levers
from benchmarks.thirdparty import Step
from benchmarks.thirdparty_models import Case


def _step(loss: float, *grads: torch.Tensor | None) -> Step:
    return Step(peak_bytes=0, loss=torch.tensor(loss), grads=grads, buffers=())


def test_max_relative_difference():
    g = torch.tensor([1.0, -4.0])
    assert levers._max_relative(_step(1.0, g, None), _step(1.0, g.clone(), None)) == 0.0
    # max |a - b| / max |b| per tensor: 0.004 / 4
    assert abs(levers._max_relative(_step(1.0, g + torch.tensor([0.004, 0.0])), _step(1.0, g)) - 1e-3) < 1e-6
    assert levers._max_relative(_step(1.0, g), _step(1.0, None)) == float("inf")  # a gradient missing on one side
    assert levers._max_relative(_step(1.0, g), _step(1.0, g, g)) == float("inf")  # a different number of gradients
    # a gradient zero in exact arithmetic (an attention key's bias) differs by rounding: against the step's largest
    # gradient, not its own size (diffusers' UNet read 1.8 where the difference was 1e-10)
    tiny = torch.tensor([6e-11, -2e-11])
    assert levers._max_relative(_step(1.0, g, tiny + 1e-10), _step(1.0, g, tiny)) < 1e-9
    assert abs(levers._max_relative(_step(1.0, g, tiny + 0.004), _step(1.0, g, tiny)) - 1e-3) < 1e-6


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Dropout(0.1)) for _ in range(4))
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _mlp_case() -> Case:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return _MLP()

    def inputs():
        torch.manual_seed(1)
        return (torch.randn(64, 32),), {}, torch.randint(0, 5, (64,))

    return Case("torch", build, inputs, lambda out, y: F.cross_entropy(out, y), lambda m, _: m)


def test_every_lever_on_a_small_model_is_measured():
    """Each lever solved, applied and stepped: the allocator at or under the prediction, gradients bitwise; the
    chunked lever on a model whose head apply cannot chunk is a row that says so, not a failure."""
    case = _mlp_case()
    levers.LOSS_NAMES.setdefault(case.loss, "F.cross_entropy")
    result = levers.run_case("mlp", case)
    rows = {x["lever"]: x for x in result["levers"]}
    assert set(rows) == set(levers.LEVERS)
    for lever in ("regions", "kept", "nested"):
        x = rows[lever]
        assert x["status"] != "failed", x
        assert x["allocator"] <= x["predicted"] <= x["budget"], x
        assert x["same"], x
    assert rows["regions"]["uses"].split(", ")[1] == "0 kept"
    assert rows["chunked"]["status"] in ("no row-wise call", levers.REFUSED) or rows["chunked"]["same"], rows["chunked"]
    page = levers.report([result], [])
    measured = sum("allocator" in x for x in result["levers"])
    assert f"{measured} of {measured} applied plans at or below their prediction" in page
