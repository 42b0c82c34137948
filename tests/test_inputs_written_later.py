"""A region whose input the model writes in place after it (NOTE [ Inputs written after a region ])."""

import torch
from torch import nn

from scheduler.applier import apply
from scheduler.tracer import capture
from scheduler.verify import verify
from solvers import Plan


class _WrittenLater(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        t = x * 2
        h = torch.tanh(self.lin(x) + t)  # nothing saves t in eager; checkpoint keeps it as the region's input ...
        t.add_(1)  # ... which the model then writes in place (BART's shift_tokens_right does this)
        return h.sum() + t.sum()


def test_region_recomputes_from_its_inputs_as_they_were():
    torch.manual_seed(0)
    model, x = _WrittenLater(), torch.randn(4, 8)
    g = capture(model, (x,)).graph
    plan = Plan.from_regions(g, [(g.index["lin"], g.index["tanh"])])
    assert g.index["mul"] < g.index["lin"]  # t comes from outside the region
    applied = apply(model, plan, (x,))
    v = verify(model, plan, (x,), applied=applied, steps=1, measure_memory=False)
    assert applied.region_modules()[0].recomputes >= 1
    assert v.max_grad_diff == 0 and v.loss_diff == 0
