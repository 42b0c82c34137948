"""A region whose input the model writes in place after it (NOTE [ Inputs written after a region ])."""

import torch
from torch import nn

from graphs import HOLDS_OP
from scheduler.applying.graph import apply
from scheduler.tracing.tracer import capture
from scheduler.measuring.verification import verify
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


class _ShiftRight(nn.Module):
    """T5's and BART's decoder inputs: a zeros tensor written through a view, then read."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.lin = nn.Linear(8, 8)

    def forward(self, ids):
        shifted = ids.new_zeros(ids.shape)
        shifted[..., 1:] = ids[..., :-1].clone()  # slice (a view of shifted), then copy_ into it
        shifted[..., 0] = 3
        shifted.masked_fill_(shifted == 7, 0)  # written in place after the slice: a region would read a copy
        return torch.tanh(self.lin(self.emb(shifted))).sum()


def test_a_view_written_later_stays_out_of_regions():
    """NOTE [ Views of written storages ]: in a region, the slice would view a
    copy of ``shifted`` and the write would miss it. The tracer marks it not
    recomputable; every other node in its own region leaves the step unchanged."""
    torch.manual_seed(0)
    model, ids = _ShiftRight(), torch.randint(1, 50, (4, 6))
    g = capture(model, (ids,), method="export").graph
    pinned = [nd for nd in g.nodes if not nd.recomputable]
    assert pinned and all(nd.out_bytes == 0 for nd in pinned)  # views and in-place writes: no storage of their own
    assert any(nd.op == "aten.slice.Tensor" for nd in pinned)
    assert any(nd.op == "aten.select.int" for nd in pinned)  # ``shifted[..., 0] = 3`` writes through it
    # Any one node in a region (without the mark the slice's and the select's regions
    # lose the writes: gradients off by ~34 and ~7.5).
    for k, nd in enumerate(g.nodes):
        if nd.recomputable and nd.op != HOLDS_OP:  # a hold runs no op of the module: no region of its own
            v = verify(model, Plan.from_regions(g, [(k, k)]), (ids,), steps=1, measure_memory=False, lower="graph")
            assert v.max_grad_diff == 0 and v.loss_diff == 0, nd.name
