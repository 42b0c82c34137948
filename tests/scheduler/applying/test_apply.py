"""scheduler.apply / verify / explain: plans from every solver keep the step exact."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import solvers
from graphs import synthetic
from solvers import InfeasibleBudget, Plan, PlanMismatch, activation_budget_bytes, enumerate_plans, simulate
from scheduler.applying.graph import CheckpointedModule, apply, cut
from scheduler.sizing.floor import explain_floor, node_floors
from scheduler.comparing.workloads import workload
from scheduler.models import build

SMALL = {
    "gpt": dict(layers=2, width=64, heads=4, vocab=256, seq=32, batch=2),
    "resnet": dict(width=8, image_size=32),
    "unet": dict(levels=2, width=8, image_size=32),
    "vgg19": dict(width=8, image_size=32, hidden=64),
    # GPT2LMHeadModel from its config at a small width and vocabulary (GPT-2 small's 768 x 50257 made this
    # one case 23 s of the suite; the blocks, dropout and tied head are the same modules at any width)
    "hf:gpt2": dict(n_layer=2, n_embd=64, n_head=2, vocab_size=512, seq=32, batch=2),
}


def _example(name: str, **over):
    torch.manual_seed(0)
    opts = {**SMALL[name], **over}
    if name == "hf:gpt2":
        return workload(name, quick=True, options=opts)  # the model in training mode, its inputs and loss
    ex = build(name, **opts)
    ex.model.train()
    return ex


def _step(module, ex, loss):
    torch.manual_seed(123)
    out = module(*ex.args, **ex.kwargs)
    value = loss(out) if loss is not None else out
    value.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in ex.model.parameters()]
    for p in ex.model.parameters():
        p.grad = None
    return value.detach(), grads, [b.clone() for b in ex.model.buffers()]


def _plans(graph):
    """One plan per registered solver (at the first budget it fits) plus a 3-region manual plan."""
    plans = []
    for name in solvers.available_solvers():
        for frac in (0.5, 0.7, 1.0):
            try:
                plans.append(solvers.solve(graph, activation_budget_bytes(graph, frac), solver=name))
                break
            except InfeasibleBudget:
                continue
    n = len(graph)
    manual = [(a, b) for a, b in ((0, n // 3 - 1), (n // 3, 2 * n // 3 - 1)) if b >= a]
    plans.append(Plan.from_regions(graph, [r for r in manual if all(graph.nodes[i].recomputable
                                                                     for i in range(r[0], r[1] + 1))]))
    return plans


@pytest.mark.parametrize("name", list(SMALL))
def test_every_solver_plan_keeps_grads_loss_and_buffers(name):
    ex = _example(name)
    before = {k: v.clone() for k, v in ex.model.state_dict().items()}
    reference = _step(ex.model, ex, ex.loss)
    after_step = {k: v.clone() for k, v in ex.model.state_dict().items()}
    torch.manual_seed(0)
    probe = apply(ex.model, Plan(regions=()), ex.args, dict(ex.kwargs), loss=ex.loss)
    # Tracing and applying leave the model's state (BatchNorm statistics) untouched.
    assert all(torch.equal(after_step[k], v) for k, v in ex.model.state_dict().items())
    plans = _plans(probe.graph)
    assert any(p.regions for p in plans)
    for plan in plans:
        split, regions = cut(probe.traced, plan)
        applied = CheckpointedModule(ex.model, split, probe.traced, plan, regions)
        _restore(ex.model, before)
        got = _step(applied, ex, None)
        _restore(ex.model, before)
        assert torch.equal(got[0], reference[0]), (plan.solver, plan.regions)
        for g0, g1 in zip(reference[1], got[1]):
            assert (g0 is None) == (g1 is None)
            if g0 is not None:
                assert torch.equal(g0, g1), (plan.solver, plan.regions)
        for b0, b1 in zip(reference[2], got[2]):
            assert torch.equal(b0, b1), (plan.solver, "buffers")
        if plan.regions:
            # each region is recomputed at most once (one with nothing saved for backward needs none)
            assert 1 <= sum(r.recomputes for r in applied.region_modules()) <= len(regions)
            assert all(r.recomputes <= 1 for r in applied.region_modules())


def _cut(model, traced, plan):
    """``apply(model, plan, ...)`` on a trace already made (``apply`` traces the model again, seconds each)."""
    split, regions = cut(traced, plan)
    return CheckpointedModule(model, split, traced, plan, regions)


def _restore(model, state):
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(state[k])


def test_batchnorm_statistics_need_the_restore():
    ex = _example("resnet")
    state = {k: v.clone() for k, v in ex.model.state_dict().items()}
    ref = _step(ex.model, ex, None)
    _restore(ex.model, state)
    plan_probe = apply(ex.model, Plan(regions=()), ex.args, dict(ex.kwargs))
    n = len(plan_probe.graph)
    plan = Plan.from_regions(plan_probe.graph, [(0, n // 2)])
    applied = _cut(ex.model, plan_probe.traced, plan)
    assert applied.regions[0].stateful
    got = _step(applied, ex, None)
    assert all(torch.equal(a, b) for a, b in zip(ref[2], got[2]))
    # Without the snapshot/restore the recompute updates the statistics a second time.
    _restore(ex.model, state)
    for region in applied.region_modules():
        region.stateful = False
    bad = _step(applied, ex, None)
    assert not all(torch.equal(a, b) for a, b in zip(ref[2], bad[2]))


def test_same_parameters_optimizer_and_state_dict():
    ex = _example("gpt")
    opt = torch.optim.SGD(ex.model.parameters(), lr=0.1)
    keys = list(ex.model.state_dict())
    probe = apply(ex.model, Plan(regions=()), ex.args, dict(ex.kwargs))
    plan = Plan.from_regions(probe.graph, [(1, len(probe.graph) // 2)])
    applied = _cut(ex.model, probe.traced, plan)
    assert list(applied.state_dict()) == keys
    assert [id(p) for p in applied.parameters()] == [id(p) for p in ex.model.parameters()]
    before = [p.detach().clone() for p in ex.model.parameters()]
    loss = applied(*ex.args, **ex.kwargs)
    assert loss.ndim == 0  # the model returns its loss: same structure
    loss.backward()
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, ex.model.parameters()))
    applied.eval()
    assert not ex.model.training and all(not m.training for m in ex.model.modules())


def test_output_structure_is_the_models():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return {"out": self.b(h), "hidden": (h, h * 2)}

    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 8)
    probe = apply(net, Plan(regions=()), (x,))
    applied = apply(net, Plan.from_regions(probe.graph, [(0, 1)]), (x,))
    out, ref = applied(x), net(x)
    assert set(out) == {"out", "hidden"} and isinstance(out["hidden"], tuple)
    assert torch.equal(out["out"], ref["out"]) and torch.equal(out["hidden"][1], ref["hidden"][1])


def test_plan_for_another_model_shape_or_dtype_is_refused():
    ex = _example("gpt")
    probe = apply(ex.model, Plan(regions=()), ex.args, dict(ex.kwargs))
    plan = Plan.from_regions(probe.graph, [(1, 5)])
    other_shape = _example("gpt", batch=3)
    with pytest.raises(PlanMismatch, match="inputs"):
        apply(other_shape.model, plan, other_shape.args, dict(other_shape.kwargs))
    other_dtype = _example("gpt", dtype="float64")
    with pytest.raises(PlanMismatch, match="dtype"):
        apply(other_dtype.model, plan, other_dtype.args, dict(other_dtype.kwargs))
    other_model = _example("vgg19")
    with pytest.raises(PlanMismatch, match="model"):
        apply(other_model.model, plan, other_model.args, dict(other_model.kwargs))


def test_cli_apply_verify(tmp_path, capsys):
    from scheduler.cli import main

    ex = _example("gpt")
    probe = apply(ex.model, Plan(regions=()), ex.args, dict(ex.kwargs))
    graph = probe.graph
    plan = solvers.solve(graph, activation_budget_bytes(graph, 0.9), solver="ilp")
    path = tmp_path / "plan.json"
    plan.save(path)
    opts = [f"-O{k}={v}" for k, v in SMALL["gpt"].items()]
    assert main(["apply", "gpt", str(path), *opts, "--verify", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "peak measured" in out and "max gradient difference" in out
    # A budget the plan cannot meet makes --verify fail.
    tight = dict(json.loads(path.read_text()), budget_bytes=graph.param_bytes)
    path.write_text(json.dumps(tight))
    assert main(["apply", "gpt", str(path), *opts, "--verify", "--steps", "1"]) == 1


@pytest.mark.parametrize("family", ["chain", "residual", "unet"])
def test_node_floor_is_a_lower_bound_on_every_plan(family):
    g = synthetic.make(family, 7, seed=2)
    bound = max(f.bytes for f in node_floors(g))
    peaks = [simulate(g, Plan(regions=tuple(p)), record=False).peak_bytes for p in enumerate_plans(g)]
    assert bound <= min(peaks)
    floor = explain_floor(g, None)
    assert floor.bound.bytes == bound and floor.best_peak_bytes == simulate(g).peak_bytes


def test_skip_tensors_are_freed_between_regions_as_simulated():
    # Two regions whose outputs meet in a U-Net's cat: the stretch between them reads the skip
    # and must free it after its last use (a submodule call would hold it to its end), and
    # cat's view gradients must be modelled; the measured peak then equals simulate's.
    from scheduler.measuring.storages import measure_step
    from scheduler.models import build as build_model
    from scheduler.tracing.tracer import capture as capture_model

    torch.manual_seed(0)
    ex = build_model("unet", levels=3, width=8, image_size=32)
    graph = capture_model(ex.model, ex.args, ex.kwargs, loss=ex.loss, workspaces="none").graph  # storage counts
    last_cat = max(i for i, n in enumerate(graph.nodes) if n.op == "cat")
    traced = None
    for regions in ([(0, 8), (last_cat - 3, last_cat - 1)], [(0, 5), (last_cat - 2, last_cat - 1)]):
        plan = Plan.from_regions(graph, regions)
        if traced is None:
            applied = apply(ex.model, plan, ex.args, ex.kwargs, loss=ex.loss)
            traced = applied.traced  # the second plan is cut from the same trace
        else:
            applied = _cut(ex.model, traced, plan)
        measured = measure_step(applied, ex.args, ex.kwargs, loss=None).peak_bytes
        assert abs(measured - simulate(graph, plan).peak_bytes) <= 64, regions
