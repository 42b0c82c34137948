"""Ops that return their very input and record no autograd node (NOTE [ Identity nodes ] in
``scheduler.tracing.recorder``): dropout with ``p=0`` saves nothing and has no backward."""

import pytest
import torch

from scheduler.tracing.tracer import capture
from solvers import simulate


class _MLP(torch.nn.Module):
    def __init__(self, drop: torch.nn.Module) -> None:
        super().__init__()
        self.up, self.drop, self.down, self.head = torch.nn.Linear(16, 64), drop, torch.nn.Linear(64, 16), \
            torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.gelu(self.down(self.drop(self.up(x)))))


def _mlp(drop: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    return _MLP(drop).train()


@pytest.mark.parametrize("method", ["auto", "export"])
def test_dropout_with_p0_saves_nothing_and_has_no_backward(method):
    x = torch.randn(8, 16)
    kw = dict(loss=lambda y: y.square().mean(), granularity="op", method=method, workspaces="none")
    g = capture(_mlp(torch.nn.Dropout(0.0)), (x,), **kw).graph
    drops = [nd for nd in g.nodes if "dropout" in nd.op or "dropout" in nd.name]
    assert drops
    for nd in drops:
        assert nd.saved_bytes == 0 and not nd.saves_inputs and not nd.saves_output
        assert not nd.requires_grad and nd.bwd_flops == 0 and not nd.stochastic
    # Exactly the step without the dropout: the gradient passes through it unchanged, not copied.
    same = capture(_mlp(torch.nn.Identity()), (x,), **kw).graph
    assert simulate(g).peak_bytes == simulate(same).peak_bytes


def test_dropout_with_p_above_0_still_saves_its_mask():
    x = torch.randn(8, 16)
    g = capture(_mlp(torch.nn.Dropout(0.1)), (x,), loss=lambda y: y.square().mean(), granularity="op",
                workspaces="none").graph
    drops = [nd for nd in g.nodes if nd.stochastic]
    assert drops and all(nd.requires_grad and nd.saved_bytes > 0 for nd in drops)
