"""The gradient of a model input that requires grad is kept to the end of the step.

A block ``x + fc(norm(x))`` whose branch leaves through a window-merge view
chain (``view``, ``transpose``, ``contiguous``, ``view``; the reshape's
backward copies the transposed gradient): the residual ``add`` hands its
output gradient to ``x``'s ``AccumulateGrad``, which keeps it as ``x.grad``.
``simulate`` used to free it once the view chain copied it and a real step
peaked above the prediction at the branch's backward (NOTE [ Gradients of
model inputs ] in ``scheduler.tracing.costs``).
"""

import torch
from torch import nn

import scheduler
from scheduler.applying.graph import apply
from scheduler.measuring.storages import measure_step
from solvers import Plan, simulate


class _MergeBlock(nn.Module):
    def __init__(self, dim: int = 32, wide: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Sequential(nn.Linear(dim, 4 * dim), nn.Tanh(), nn.Linear(4 * dim, dim)) if wide \
            else nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x, y):
        b, n, c = x.shape
        h = self.fc(self.norm(x))
        w = h.view(b, 8, n // 8, c).transpose(1, 2).contiguous().view(b, n, c)
        return nn.functional.cross_entropy(self.head((x + w).mean(1)), y)


def _case(wide: bool):
    torch.manual_seed(0)
    model = _MergeBlock(wide=wide).train()
    kwargs = {"x": torch.randn(4, 64, 32, requires_grad=True), "y": torch.randint(0, 10, (4,))}
    g = scheduler.trace(model, (), kwargs)
    kwargs["x"].grad = None
    return model, kwargs, g


def test_input_gradient_is_kept_by_the_node_that_creates_it():
    model, kwargs, g = _case(wide=False)
    x_bytes = kwargs["x"].numel() * kwargs["x"].element_size()
    own = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(nd.param_bytes for nd in g.nodes) == own + x_bytes
    assert g.nodes[g.index["add"]].param_bytes == x_bytes  # the residual add is x's last user


def test_store_all_prediction_covers_the_measured_step():
    for wide in (False, True):
        model, kwargs, g = _case(wide)
        sim = simulate(g)
        measured = measure_step(model, (), kwargs, timeline=True)
        assert sim.peak_bytes >= measured.peak_bytes, (wide, sim.peak_bytes, measured.peak_bytes)
        if wide:  # x.grad, the copy and the tanh's gradients at once: exact
            assert sim.peak_bytes == measured.peak_bytes


def test_region_prediction_covers_the_measured_step():
    model, kwargs, g = _case(wide=True)
    first = g.index["norm"]
    last = g.index["add"] - 1
    plan = Plan.from_regions(g, [(first, last)])
    applied = apply(model, plan, (), kwargs)
    kwargs["x"].grad = None
    measured = measure_step(model, (), kwargs, run=applied).peak_bytes
    assert simulate(g, plan, record=False).peak_bytes >= measured
