"""``compiled_bound``: a bound on a compiled step's peak read from inductor's partition on fake tensors (NOTE
[ Compiled peak bound ] in scheduler/measuring/inductor.py), checked against inductor's step by the allocator."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import scheduler
from scheduler.measuring.compiled import compiled_step_peak
from scheduler.measuring.inductor import compiled_bound


class ConvNet(nn.Module):
    def __init__(self, channels: int = 16, breaks: bool = False) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1),
                                                  nn.BatchNorm2d(channels), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(channels, 10)
        self.breaks = breaks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.blocks[0](x)
        x = x + self.blocks[1](x)
        if self.breaks:  # outside a loop: Dynamo resumes after it in a second graph
            torch._dynamo.graph_break()
        x = x + self.blocks[2](x)
        return self.head(x.mean((2, 3)))


class Mlp(nn.Module):
    def __init__(self, width: int = 64, depth: int = 3) -> None:
        super().__init__()
        # dropout: inductor's random-op passes read the fake mode its compile sets (transformers' default configs)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1),
                                                  nn.Linear(4 * width, width)) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test's measured compiles from a fresh Dynamo (the copies compiled before count toward its limits)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def case(name: str):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name == "mlp":
        model, x = Mlp().train(), torch.randn(512, 64, generator=gen)
    else:
        model, x = ConvNet(breaks=name == "conv, a graph break").train(), torch.randn(8, 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (x.shape[0],), generator=gen)

    def loss(out):
        return F.cross_entropy(out, labels)

    return model, (x,), loss


def test_it_is_a_verb_of_scheduler():
    assert scheduler.compiled_bound is compiled_bound and "compiled_bound" in scheduler.__all__


def block_plan(graph):
    spans = {sp.module: (sp.first, sp.last) for sp in graph.spans}
    return scheduler.Plan.from_regions(graph, [spans[f"blocks.{i}"] for i in range(3)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["conv", "mlp", "conv, a graph break"])
@pytest.mark.parametrize("planned", [False, True])
def test_inductors_measured_peak_is_at_or_under_the_bound(name, planned):
    model, args, loss = case(name)
    graph = scheduler.trace(model, args, {}, loss=loss)
    plan = block_plan(graph) if planned else None
    bound = compiled_bound(model, plan, args, {}, loss, graph=graph)
    measured = compiled_step_peak(model, plan, args, {}, loss, backend="inductor")
    assert measured <= bound.bound_bytes, (measured, bound)
    assert bound.fused_bytes <= bound.bound_bytes
    assert bound.graphs == (2 if "break" in name else 1) and bound.eager_nodes == 0
    # saved activations were read: more than the base, and a plan saves less than the unplanned step
    assert bound.saved_bytes > 0 and bound.bound_bytes > bound.base_bytes + bound.saved_bytes // 2
    if planned:
        assert bound.saved_bytes < compiled_bound(model, None, args, {}, loss).saved_bytes


def test_channels_last_copies_are_the_convolutions_weights_and_the_batch_and_leave_with_layout_optimization():
    model, args, loss = case("conv")
    graph = scheduler.trace(model, args, {}, loss=loss)
    on = compiled_bound(model, None, args, {}, loss, graph=graph)
    weights = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Conv2d))
    scratch = max(n.workspace_bytes for n in graph.nodes if "aten.convolution.default" in n.dispatch)
    assert on.layout_bytes == weights + args[0].numel() * 4 and on.workspace_bytes == scratch
    assert not on.guaranteed  # the layout pass rewrites below the graphs: counted, not proven
    with torch._inductor.config.patch(layout_optimization=False):
        off = compiled_bound(model, None, args, {}, loss, graph=graph)
    assert off.layout_bytes == 0 and off.workspace_bytes == scratch and off.guaranteed
    assert off.bound_bytes == on.bound_bytes - on.layout_bytes
    mlp, margs, mloss = case("mlp")
    plain = compiled_bound(mlp, None, margs, {}, mloss)
    assert plain.layout_bytes == 0 and plain.guaranteed  # no convolution


def test_a_region_that_recomputes_convolutions_counts_the_backwards_channels_last_copies_too():
    """A region puts convolution forwards into the backward graph, and inductor's layout pass then runs there too:
    torchvision's MobileNetV3-small with one block as a region measured 1.47 of a bound that counted the
    forward's copies only. The backward's convolutions read every weight and return every weight's gradient."""
    model, args, loss = case("conv")
    graph = scheduler.trace(model, args, {}, loss=loss)
    weights = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Conv2d))
    unplanned = compiled_bound(model, None, args, {}, loss, graph=graph)
    planned = compiled_bound(model, block_plan(graph), args, {}, loss, graph=graph)
    assert unplanned.layout_bytes == weights + args[0].numel() * 4  # the backward has no convolution forward
    assert planned.layout_bytes >= unplanned.layout_bytes + 2 * weights
    with torch._inductor.config.patch(layout_optimization=False):
        assert compiled_bound(model, block_plan(graph), args, {}, loss, graph=graph).layout_bytes == 0


def test_the_model_its_gradients_buffers_and_random_state_are_left_as_they_were():
    model, args, loss = case("conv")
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    graph = scheduler.trace(model, args, {}, loss=loss)
    bound = compiled_bound(model, block_plan(graph), args, {}, loss, graph=graph)
    assert bound.base_bytes == sum(t.numel() * t.element_size() for t in [*model.state_dict().values(), args[0]])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and "_ckpt_plan" not in model.__dict__
    assert torch.equal(torch.get_rng_state(), rng)
    assert not isinstance(next(model.parameters()), torch._subclasses.fake_tensor.FakeTensor)


class Broken(nn.Module):
    """One region over a body Dynamo cannot trace whole: the region, and so the step, runs eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).square().mean()


def test_a_region_run_eagerly_is_bounded_with_the_eager_prediction_and_without_a_trace_says_what_to_pass(
        monkeypatch):
    model, x = Broken().train(), torch.randn(64, 32)
    graph = scheduler.trace(model, (x,), {})
    plan = scheduler.Plan.from_regions(graph, [next((sp.first, sp.last) for sp in graph.spans if sp.module == "body")])
    import torch.nn.modules.activation as act

    def broken_gelu(self, inp):  # a graph break inside the region's body
        torch._dynamo.graph_break()
        return F.gelu(inp)

    monkeypatch.setattr(act.GELU, "forward", broken_gelu)
    bound = compiled_bound(model, plan, (x,), graph=graph)
    eager = scheduler.simulate(graph, plan).peak_bytes
    assert bound.eager_nodes > 0 and bound.graphs <= 1 and eager <= bound.bound_bytes <= eager + 2 * 64 * 128 * 4
    assert compiled_step_peak(model, plan, (x,), backend="inductor") <= bound.bound_bytes
    with pytest.raises(ValueError, match="pass graph="):
        compiled_bound(model, plan, (x,))
    monkeypatch.undo()  # the body traces whole again: nothing eager, the graph's bound alone
    whole = compiled_bound(model, plan, (x,), graph=graph)
    assert whole.eager_nodes == 0 and whole.graphs == 1 and whole.saved_bytes > 0
    assert compiled_step_peak(model, plan, (x,), backend="inductor") <= whole.bound_bytes


class Pyramid(nn.Module):
    """The same block class at two resolutions, each call breaking Dynamo's graph: Dynamo compiles the block's
    frame twice and the second time marks its sizes dynamic (a U-Net's blocks under ``torch.compile``)."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.conv(x))
            torch._dynamo.graph_break()
            return x * 2

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(self.Block() for _ in range(3))
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](self.stem(x))
        x = self.blocks[1](F.max_pool2d(x, 2))
        x = self.blocks[2](F.max_pool2d(x, 2))
        return self.head(x.mean((2, 3)))


def test_sizes_dynamo_made_dynamic_are_read_at_the_step_s_own_sizes():
    """Symbolic sizes (automatic dynamic shapes) are read at their hints: the bound is a number of bytes, not a
    symbolic expression that fails when compared (the third-party page crashed so on its report)."""
    torch.manual_seed(0)
    model, x = Pyramid().train(), torch.randn(2, 3, 32, 32)
    labels = torch.randint(0, 10, (2,))

    def loss(out):
        return F.cross_entropy(out, labels)

    graph = scheduler.trace(model, (x,), {}, loss=loss)
    bound = compiled_bound(model, None, (x,), {}, loss, graph=graph)
    assert type(bound.bound_bytes) is int and type(bound.fused_bytes) is int and type(bound.saved_bytes) is int
    assert bound.graphs > 3  # the block's frame compiled again, dynamic
    assert compiled_step_peak(model, None, (x,), {}, loss) <= bound.bound_bytes
