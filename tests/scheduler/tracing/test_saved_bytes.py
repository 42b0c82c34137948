"""A custom ``torch.autograd.Function`` saves what its ``ctx`` saves, not what its forward's ops would.

BLOOM's GeLU is such a function: it saves its input and recomputes the rest
in its backward. ``torch.export`` used to inline its forward, so the traced
graph module ran eight elementwise ops under autograd, each saving its
inputs; the cost graph, exact for that graph module, predicted a store-all
step far above the model's own (NOTE [ Custom autograd functions ] in
``scheduler.tracing.capture``).
"""

from __future__ import annotations

import torch
from torch import nn

import scheduler
from scheduler.measuring.storages import measure_step
from scheduler.tracing.tracer import capture
from solvers import simulate


class TanhGelu(torch.autograd.Function):
    """tanh-approximated GeLU that keeps only its input for the backward."""

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        return g * (0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t))


class Mlp(nn.Module):
    def __init__(self, width: int = 64, hidden: int = 256, layers: int = 3):
        super().__init__()
        self.ups = nn.ModuleList(nn.Linear(width, hidden) for _ in range(layers))
        self.downs = nn.ModuleList(nn.Linear(hidden, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for up, down in zip(self.ups, self.downs):
            x = x + down(TanhGelu.apply(up(x)))
        return x.square().mean()


def _traced():
    torch.manual_seed(0)
    model = Mlp().train()
    x = torch.randn(64, 64)
    # torch.fx inlines the function too; transformers models go through torch.export, kept whole now.
    return model, x, capture(model, (x,), method="export", granularity="op")


def test_custom_function_stays_one_node_with_its_own_saves():
    model, x, tr = _traced()
    ops = [nd.op for nd in tr.graph.nodes]
    assert "aten.tanh.default" not in ops  # the forward was not inlined
    gelus = [nd for nd in tr.graph.nodes if nd.op == "flat_apply"]
    assert len(gelus) == 3
    for nd in gelus:  # it saves its input (the up projection's output), nothing of its own
        assert nd.saved_bytes == 0 and not nd.saves_output and len(nd.saves_inputs) == 1
    # The graph module computes what the model computes, gradients included.
    model.zero_grad(set_to_none=True)
    ref = model(x)
    ref.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    got = tr(x)
    got.backward()
    assert torch.equal(ref.detach(), got.detach())
    assert all(torch.equal(a, p.grad) for a, p in zip(want, model.parameters()))


def test_store_all_prediction_is_the_models_measured_step():
    model, x, tr = _traced()
    predicted = simulate(tr.graph, None).peak_bytes
    eager = measure_step(model, (x,)).peak_bytes
    traced = measure_step(model, (x,), run=tr).peak_bytes
    assert traced == eager  # the graph module needs what the model needs
    # Within 1 %: inlined, the GeLU's saved intermediates put the prediction 60 % above.
    assert abs(predicted - eager) <= 0.01 * eager, (predicted, eager)



def test_seed_gradient_is_held_to_the_end_of_the_backward():
    """``loss.backward()`` keeps the ``ones`` it seeds the backward with until it
    returns: the 4 bytes of a float32 loss are live at every backward step, and
    simulate counts them (it once freed them after the loss's own backward and
    predicted 4 bytes under the measured peak)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))

    def loss(out):
        return torch.nn.functional.cross_entropy(out, y)

    graph = scheduler.trace(net, (x,), loss=loss)
    sim = simulate(graph, None)
    assert sim.peak_phase == "backward" and sim.peak_node != graph.nodes[-1].name  # after the loss's backward
    assert sim.peak_bytes == measure_step(net, (x,), loss=loss).peak_bytes
