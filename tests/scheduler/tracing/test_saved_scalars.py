"""Python numbers an autograd node saves as wrapped 0-dim tensors, past the saved-tensor hooks
(NOTE [ Saved Python scalars ] in ``scheduler.tracing.costs``)."""

import torch

import scheduler
from scheduler.measuring.verification import verify
from scheduler.tracing.tracer import capture
from solvers import InfeasibleBudget, simulate


class _Block(torch.nn.Module):
    def __init__(self, width: int, scalar: bool) -> None:
        super().__init__()
        self.lin, self.scalar = torch.nn.Linear(width, width), scalar

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return x + torch.tanh(h * (0.125 if self.scalar else h))  # as an attention scales its queries


class _Scaled(torch.nn.Module):
    """Blocks that scale by a Python float (``q * scaling``), then a small head."""

    def __init__(self, blocks: int = 3, width: int = 32, scalar: bool = True) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*(_Block(width, scalar) for _ in range(blocks)))
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def _loss(y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(y, torch.zeros(y.shape[0], dtype=torch.long))


def _model(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return _Scaled(**kw).train()


def test_each_saved_python_scalar_is_counted_once_as_held_bytes():
    x = torch.randn(16, 32)
    g = capture(_model(), (x,), loss=_loss, granularity="op", workspaces="none").graph
    without = capture(_model(scalar=False), (x,), loss=_loss, granularity="op", workspaces="none").graph
    assert g.meta["saved_scalar_bytes"] == 3 * 8  # one float64 ``other`` per MulBackward0
    assert "saved_scalar_bytes" not in without.meta  # tensor operands go through the hooks as before
    assert g.input_bytes - without.input_bytes == 3 * 8
    # each node's share, by name (a pipeline stage holds its own nodes' per micro-batch), out of the fingerprint
    per_node = g.meta["saved_scalars"]
    assert sum(per_node.values()) == 3 * 8 and len(per_node) == 3
    assert all(g.nodes[g.index[name]].module.startswith("blocks.") for name in per_node)
    bare = g.with_nodes(g.nodes, meta={k: v for k, v in g.meta.items() if k != "saved_scalars"})
    assert bare.fingerprint() == g.fingerprint()


def test_a_plan_at_its_least_feasible_budget_fits_the_allocator_with_saved_scalars():
    """Checkpointing cannot drop the scalars: each region keeps its 8 bytes to its backward."""
    x = torch.randn(64, 32)
    model = _model(blocks=6)
    graph = scheduler.trace(model, (x,), loss=_loss)
    try:
        plan = scheduler.solve(graph, 1, solver="ilp", time_limit_s=10)
    except InfeasibleBudget as exc:
        plan = scheduler.solve(graph, exc.min_feasible_bytes, solver="ilp", time_limit_s=10)
    assert plan.regions
    v = verify(model, plan, (x,), loss=_loss, steps=1, warmup=0, graph=graph)
    assert v.measured_peak_bytes <= simulate(graph, plan).peak_bytes <= plan.budget_bytes, v
    assert v.measured_store_all_bytes <= v.predicted_store_all_bytes, v
