"""A pointwise backward that copies a strided gradient: its copy is in the prediction.

Found by the random-module generator (benchmarks/random_modules.py, module s31: ``join(cat((gelu(a(x)),
b(x)), -1))``). The gradient that ``cat``'s backward hands to the gelu is a slice of its own output gradient,
strided over the other half; on this project's CPU build ``gelu_backward`` copies it before it runs (its
oneDNN path), a buffer no traced tensor shows. The workspace probe skipped every op tagged pointwise, so
every plan of that module, store-all included, in both loops, measured 96 B above ``simulate`` by the
allocator (4,440 B against 4,344 held). Pointwise calls with a non-contiguous argument are measured now
(NOTE [ Op workspaces ] in ``scheduler/tracing/workspaces.py``). The assertion holds on any CPU: a kernel
that takes the slice as it is measures no workspace and the prediction does not grow.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import scheduler
from scheduler.measuring.steps import allocator_step_peak
from solvers import Plan, simulate


class CatBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.a, self.b = nn.Linear(3, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.join, self.head = nn.Linear(16, 8), nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(self.join(torch.cat((F.gelu(self.a(h)), self.b(h)), -1)))


@pytest.mark.parametrize("loop", ["held", "dropped"])
def test_a_strided_gradients_copy_is_predicted(loop):
    torch.manual_seed(0)
    model = CatBranch().train()
    x, labels = torch.randn(1, 4, 3), torch.randint(0, 16, (1, 4))

    def loss(out):
        return F.cross_entropy(out.reshape(-1, 16), labels.reshape(-1))

    graph = scheduler.trace(model, (x,), {}, loss=loss).with_loop(loop)
    store_all = Plan.from_regions(graph, [])
    assert allocator_step_peak(model, model, (x,), {}, loss, loop=loop) <= simulate(graph, store_all).peak_bytes
    span = next(sp for sp in graph.spans if sp.module == "join")
    plan = Plan.from_regions(graph, [(span.first, span.last)])
    planned = copy.deepcopy(model)
    scheduler.apply(planned, plan)
    assert allocator_step_peak(planned, planned, (x,), {}, loss, loop=loop) <= simulate(graph, plan).peak_bytes
