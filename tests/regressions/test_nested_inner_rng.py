"""A stochastic inner region's generator state, stored again by the outer's recompute, lives to the inner
region's own recompute (NOTE [ Nested regions ] in solvers.model.nested).

Found by the random-module generator (benchmarks/random_plans.py, module s22: LayerNorm, Linear, GELU,
Dropout(0.1) in one block, the block a region with its dropout call nested): the outer's recompute runs the
inner checkpoint again, which stores the CPU generator's state (5,056 bytes) for the inner region's own
recompute; ``simulate`` released that copy when the outer's recompute ended, so the step measured 4,800 bytes
over its prediction by the allocator (22,000 against 17,200).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import scheduler
from scheduler.measuring.steps import allocator_step_peak
from solvers import Plan, simulate


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.proj, self.act, self.drop = nn.LayerNorm(8), nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.act(self.proj(self.ln(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(3, 8), Block(), nn.Linear(8, 11)

    def forward(self, x):
        return self.head(self.block(self.stem(x)))


def test_an_inner_dropout_region_fits_its_prediction():
    torch.manual_seed(0)
    model, x, y = Model().train(), torch.randn(1, 8, 3), torch.randint(0, 11, (1, 8))

    def loss(out):
        return F.cross_entropy(out.reshape(-1, 11), y.reshape(-1))

    graph = scheduler.trace(model, (x,), {}, loss=loss)
    spans = {sp.module: (sp.first, sp.last) for sp in graph.spans}
    plan = Plan.from_regions(graph, [spans["block"]], inner=[spans["block.drop"]])
    assert plan.inner_stochastic == (True,)
    predicted = simulate(graph, plan).peak_bytes
    scheduler.apply(model, plan)
    assert allocator_step_peak(model, model, (x,), {}, loss) <= predicted
