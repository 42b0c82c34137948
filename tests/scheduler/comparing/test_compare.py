"""ckpt compare: peers, the profiler meter, claims, and the command end to end (--quick)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from scheduler.comparing import peers
from scheduler.comparing.rows import Row
from scheduler.comparing.run import Comparison
from scheduler.comparing.claims import claims
from scheduler.measuring.profiler import profile_step
from scheduler.measuring.steps import grad_difference, grad_snapshot
from scheduler.measuring.storages import live_bytes_of


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.relu(self.fc1(x))))


class Stack(nn.Module):
    """Blocks in a ModuleList, run as a chain (fx-traceable)."""

    def __init__(self, d: int = 32, n: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.out = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x).square().mean()


class Skips(nn.Module):
    """Each layer reads the first layer's output: no chain covers the model."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = self.layers[0](x)
        h = h0
        for layer in self.layers[1:]:
            h = layer(h) + h0
        return h.mean()


def _grads(model: nn.Module, forward, x: torch.Tensor) -> list[torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(3)
    forward(x).backward()
    return grad_snapshot(list(model.parameters()))


@pytest.fixture
def stack() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Stack().train(), torch.randn(8, 32)


def test_find_blocks_prefers_the_module_list(stack):
    model, _ = stack
    names = [n for n, _ in peers.find_blocks(model)]
    assert names == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert peers.find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []


def test_per_block_checkpoints_every_block_and_undo_restores(stack):
    model, x = stack
    ref = _grads(model, model, x)
    prep = peers.per_block(model)
    assert all("forward" not in vars(b) for b in model.blocks)  # on for its own calls only
    prep.install()
    assert all("forward" in vars(b) for b in model.blocks)
    got = _grads(model, prep.forward, x)
    prep.undo()
    assert all("forward" not in vars(b) for b in model.blocks)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))  # RNG replayed: dropout masks equal
    with pytest.raises(peers.PeerUnavailable, match="no repeated blocks"):
        peers.per_block(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


def test_sequential_runs_the_chain_with_same_gradients(stack):
    model, x = stack
    ref = _grads(model, model, x)
    prep = peers.sequential(model)
    assert "segments" in prep.note
    _grads(model, prep.forward, x)
    diff, _ = grad_difference(list(model.parameters()), ref)
    assert diff < 1e-6
    seq = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 4)), nn.Tanh())
    assert "4 layers in 2 segments" == peers.sequential(seq).note


def test_sequential_says_why_a_model_with_skips_is_not_a_sequence():
    with pytest.raises(peers.PeerUnavailable, match="not a sequence"):
        peers.sequential(Skips())


def test_profiler_peak_agrees_with_the_dispatch_meter_on_eager(stack):
    from scheduler.measuring.storages import measure_step

    model, x = stack
    for p in model.parameters():
        p.grad = None
    base = live_bytes_of(list(model.parameters()) + list(model.buffers()) + [x])
    trace = profile_step(lambda: model(x).backward(), baseline_bytes=base)
    meter = measure_step(model, (x,))
    assert trace.baseline_bytes == meter.base_bytes
    assert abs(trace.peak_bytes - meter.peak_bytes) <= 0.05 * meter.peak_bytes
    assert trace.kernel_flops > 0 and trace.live_bytes[0] >= base


def test_grad_difference_scales_by_the_reference():
    p = nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([1.0, 2.0, 4.0])
    assert grad_difference([p], [torch.tensor([1.0, 2.0, 3.0])]) == (1.0, pytest.approx(1 / 3))


def _row(method, kind, budget, peak, ratio):
    return Row(method, kind, budget=budget, measured_peak_bytes=peak, step_time_ratio=ratio)


def test_claims_compare_at_no_larger_peak():
    rows = (_row("none", "peer", None, 100, 1.0), _row("per-block", "peer", None, 60, 1.3),
            _row("torch.compile", "peer", 0.5, 50, 1.2), _row("dp", "ours", 0.5, 55, 1.1),
            _row("dp", "ours", 0.3, 40, 1.25))
    cmp = Comparison("m", {}, (0.3, 0.5), rows, 10, 1, {})
    got = {c["claim"].split(":")[0]: c["holds"] for c in claims(cmp)}
    assert got == {"ours vs per-block": True, "ours vs torch.compile @0.5": False}
    slow = rows[:2] + (_row("dp", "ours", 0.5, 55, 1.4),)
    assert [c["holds"] for c in claims(Comparison("m", {}, (0.5,), slow, 10, 1, {}))] == [False]


def test_ckpt_compare_quick_reports_every_method(tmp_path):
    from scheduler.cli import main

    out = tmp_path / "out.json"
    assert main(["compare", "gpt", "--quick", "--budgets", "0.5", "--repeats", "2", "--threads", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    methods = {r["method"] for r in rows}
    assert {"none", "per-block", "checkpoint_sequential", "torch.compile"} <= methods
    assert methods - {"none", "per-block", "checkpoint_sequential", "torch.compile"}, "no solver of ours ran"
    assert {r["budget"] for r in rows if r["method"] == "torch.compile"} == {0.5, 1.0}
    for r in rows:
        if r["reason"] is None:
            assert r["measured_peak_bytes"] > 0 and r["step_time_ratio"] > 0, r
            assert r["grad_max_abs_diff"] is not None and r["measured_recompute_ratio"] is not None, r
        else:
            assert isinstance(r["reason"], str) and len(r["reason"]) > 10, r
    none = next(r for r in rows if r["method"] == "none")
    # The profiler and the dispatch-mode meter see the same eager step.
    assert abs(none["measured_peak_bytes"] - none["meter_peak_bytes"]) <= 0.05 * none["meter_peak_bytes"]
    # Checkpointing with RNG replay leaves gradients unchanged.
    assert all(r["grad_max_abs_diff"] < 1e-5 for r in rows if r["method"] == "per-block" and r["reason"] is None)
    assert data["timelines"]["none"]["measured_bytes"]


def test_max_batches_finds_the_edge_and_ranks_methods():
    import solvers
    from graphs import synthetic
    from benchmarks.maxbatch import max_batches

    def graph_at(b: int):
        return synthetic.chain(12, out_bytes=b * 1024, flops=10**6)

    budget = solvers.simulate(graph_at(40)).peak_bytes
    rows = max_batches(graph_at, budget, ["store-all", "uniform"], hi=512)
    base, uni = rows
    assert base.batch == 40 and base.ratio == 1.0 and not base.capped
    assert uni.batch is not None and uni.batch > base.batch and uni.ratio == uni.batch / 40
    for r in rows:  # the answer fits and the next batch does not
        assert r.predicted_peak_bytes <= budget
        with pytest.raises(solvers.InfeasibleBudget):
            solvers.solve(graph_at(r.batch + 1), budget, solver=r.method)


def test_timeline_places_predicted_steps_by_cost_done():
    from types import SimpleNamespace

    from graphs import synthetic
    from scheduler.comparing.tables import timeline
    from solvers import simulate

    g = synthetic.make("chain", 6, seed=0)
    sim = simulate(g, None)
    measured = SimpleNamespace(times_s=[0.0, 1.0, 3.0], live_bytes=[0, 5, 0])
    tl = timeline(sim, measured, g)
    xs = tl["predicted_x"]
    assert xs == sorted(xs) and xs[-1] == 1.0
    fwd = g.total_fwd_flops()
    turn = xs[len(g) - 1]  # the last forward step
    assert abs(turn - fwd / (fwd + g.total_bwd_flops())) < 1e-9
    assert tl["measured_x"] == [0.0, 1 / 3, 1.0]


@pytest.mark.parametrize("workspaces", ["none", "measure"])
def test_the_max_batch_protocol_plans_for_the_cpu_it_confirms_on(workspaces):
    """The VGG-19 protocol traces on meta: its plans are for the CPU that ``confirm`` runs them on (a meta model
    is planned for an H100 otherwise, and apply refuses that plan on the CPU graph)."""
    import solvers
    from benchmarks.maxbatch import vgg_maxbatch_setup

    graph_at, confirm, _, _, _ = vgg_maxbatch_setup(quick=True, workspaces=workspaces)
    graph = graph_at(16)
    with pytest.raises(solvers.InfeasibleBudget) as least:
        solvers.solve(graph, 1, solver="dp")
    plan = solvers.solve(graph, least.value.min_feasible_bytes, solver="dp")
    # without workspaces the least plan checkpoints something, so confirm applies it (with them, one
    # convolution's backward workspace can set the floor, and tracing for the CPU is what is checked)
    assert plan.regions or workspaces == "measure"
    allocator, storages = confirm(16, plan)
    assert 0 < storages <= allocator
