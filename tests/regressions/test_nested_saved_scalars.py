"""The Python scalars a nested region's recompute saves live to the end of that recompute (NOTE [ Nested
regions ] in solvers.model.nested; NOTE [ Saved Python scalars ] in scheduler.tracing.costs).

Found by the random-module generator (benchmarks/generated.py, modules s33, s43, s51, s54: a manual attention,
``scores / math.sqrt(d)``, its block a region with its output projection nested): ``DivBackward0`` saves the
wrapped ``float64`` divisor without the saved-tensor hooks, so the outer's recompute makes one more 8-byte copy,
held by the recompute's autograd graph until the recompute ends (the forward's copy is in ``input_bytes``).
``simulate`` did not charge it: 15 of 476 nested pairs measured 8 bytes over their prediction by the allocator
(s51: 16,016 against 16,008).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import scheduler
from scheduler.measuring.steps import allocator_step_peak
from solvers import Plan, simulate


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = (q @ k.transpose(-2, -1)) / 2.0
        return self.out(F.dropout(scores.softmax(-1), 0.1, self.training) @ v)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.attn, self.head = nn.Linear(3, 8), Attn(), nn.Linear(8, 11)

    def forward(self, x):
        return self.head(self.attn(self.stem(x)))


def test_a_nested_recompute_holds_the_scalars_it_saves():
    torch.manual_seed(0)
    model, x, y = Model().train(), torch.randn(1, 16, 3), torch.randint(0, 11, (1, 16))

    def loss(out):
        return F.cross_entropy(out.reshape(-1, 11), y.reshape(-1))

    graph = scheduler.trace(model, (x,), {}, loss=loss)
    assert graph.meta.get("saved_scalar_bytes") == 8  # the divisor, saved by DivBackward0
    spans = {sp.module: (sp.first, sp.last) for sp in graph.spans}
    plan = Plan.from_regions(graph, [spans["stem"], spans["attn"], spans["head"]], inner=[spans["attn.out"]])
    sim = simulate(graph, plan)
    assert sim.peak_phase == "recompute"
    scheduler.apply(model, plan)
    assert allocator_step_peak(model, model, (x,), {}, loss) <= sim.peak_bytes
