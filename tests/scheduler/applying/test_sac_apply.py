"""Selective plans applied onto the built-in models (NOTE [ Selective checkpoint policies ]).

For gpt, resnet and unet: a ``dp`` plan that keeps some op outputs inside its
regions, applied onto the module itself, runs one real CPU step whose loss,
gradients and BatchNorm statistics are bitwise those of the step without the
plan, and whose peak by tensor storages is at or below ``simulate``'s
prediction. A plan naming a call its region never makes, or whose kept overload
is called another number of times, degrades: those calls are recomputed, with a
:class:`KeptOpsDropped` warning, and the step's gradients are unchanged (NOTE [
Kept calls that do not come ]). The CLI round trip writes ``save_ops`` and verifies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch

import scheduler
from scheduler.applying import KeptOpsDropped, region_wrappers
from scheduler.cli import main
from scheduler.measuring.storages import measure_step
from scheduler.models import build

# (model options, budget): sizes at which dp keeps something at that budget.
SETUPS = {
    "gpt": (dict(layers=2, width=64, heads=4, seq=128, batch=4, vocab=128), 0.7),
    "resnet": (dict(batch=4, image_size=64), 0.8),
    "unet": (dict(batch=4, image_size=64), 0.9),
}

_CACHE: dict[str, tuple] = {}


def setup(name: str):
    if name not in _CACHE:
        options, budget = SETUPS[name]
        torch.manual_seed(0)
        ex = build(name, **options)
        graph = scheduler.trace(ex.model, ex.args, ex.kwargs, loss=ex.loss)
        plan = scheduler.solve(graph, budget=budget, solver="dp", selective=True)
        _CACHE[name] = (ex, graph, plan)
    return _CACHE[name]


def step(ex) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[torch.Tensor]]:
    model = ex.model
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(0)
    out = model(*ex.args, **ex.kwargs)
    loss = ex.loss(out) if ex.loss is not None else out
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, [b.detach().clone() for b in model.buffers()]


@pytest.mark.parametrize("name", list(SETUPS))
def test_selective_plan_keeps_gradients_and_fits_the_prediction(name):
    ex, graph, plan = setup(name)
    assert plan.saved and any(plan.save_ops), "dp keeps some op outputs at this budget"
    model = ex.model
    scheduler.remove(model)
    before = [b.detach().clone() for b in model.buffers()]
    l0, g0, b0 = step(ex)
    with torch.no_grad():
        for b, s in zip(model.buffers(), before):
            b.copy_(s)
    scheduler.apply(model, plan)
    wrappers = region_wrappers(model)
    policies = [w.policy for w in wrappers if getattr(w, "policy", None)] + [
        p for w in wrappers for p in getattr(w, "policies", {}).values()]
    assert policies, "the regions that keep op outputs run under a policy"
    l1, g1, b1 = step(ex)
    assert torch.equal(l0, l1)
    assert g0.keys() == g1.keys() and all(torch.equal(g0[k], g1[k]) for k in g0)
    assert all(torch.equal(x, y) for x, y in zip(b0, b1)), "BatchNorm statistics updated once"
    wanted = {op for p in policies for op in p.save_ops}
    assert wanted == {op for p in policies for op in p.saved}, "every listed call was saved"
    predicted = scheduler.simulate(graph, plan).peak_bytes
    measured = measure_step(model, ex.args, ex.kwargs, loss=ex.loss).peak_bytes
    print(f"{name}: saved {plan.saved} {plan.save_ops}; measured {measured} predicted {predicted} "
          f"({predicted - measured} below)")
    assert measured <= predicted
    scheduler.remove(model)


def _degrades(ex, plan, match: str, off: str) -> None:  # noqa: ANN001
    """A step with ``plan`` applied warns :class:`KeptOpsDropped` matching ``match``, stops keeping ``off`` in
    that region, and its loss and gradients are bitwise the unplanned step's (twice: the next step keeps it off)."""
    model = ex.model
    scheduler.remove(model)
    before = [b.detach().clone() for b in model.buffers()]
    l0, g0, _ = step(ex)
    scheduler.apply(model, plan)
    try:
        for k in range(2):
            with torch.no_grad():
                for b, s in zip(model.buffers(), before):
                    b.copy_(s)
            with pytest.warns(KeptOpsDropped, match=match) if k == 0 else contextlib.nullcontext():
                l1, g1, _ = step(ex)
            assert torch.equal(l0, l1)
            assert g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0)
            policies = [w.policy for w in region_wrappers(model) if getattr(w, "policy", None)]
            assert any(off in p.off for p in policies)
            assert not any(op == off for p in policies if off in p.off for op, _ in p.saved)
    finally:
        scheduler.remove(model)


@pytest.mark.parametrize("bad", [("aten.cholesky.default", 0), ("aten.convolution.default", 10_000),
                                 ("aten.addmm.default", 10_000)], ids=str)
def test_a_call_the_region_never_makes_is_recomputed(bad):
    ex, graph, plan = setup("gpt")
    r = next(i for i, ops in enumerate(plan.save_ops) if ops)
    save_ops = list(plan.save_ops)
    save_ops[r] = save_ops[r] + (bad,)
    _degrades(ex, dataclasses.replace(plan, save_ops=tuple(save_ops)), rf"region {plan.modules[r]!r}.*{bad[0]}",
              bad[0])


def test_a_shifted_call_count_is_recomputed():
    ex, graph, plan = setup("gpt")
    r = next(i for i, ops in enumerate(plan.save_ops) if ops)
    assert plan.save_op_calls[r], "the plan carries the traced calls of its kept overloads"
    calls = list(plan.save_op_calls)
    op, n = calls[r][0]
    calls[r] = ((op, n + 1),) + calls[r][1:]
    _degrades(ex, dataclasses.replace(plan, save_op_calls=tuple(calls)), rf"{op}: traced {n + 1} time.*called {n} time",
              op)


def test_a_call_count_above_the_trace_is_let_go_of_at_once():
    ex, graph, plan = setup("gpt")
    r = next(i for i, ops in enumerate(plan.save_ops) if ops)
    calls = list(plan.save_op_calls)
    op, n = calls[r][0]
    calls[r] = ((op, n - 1),) + calls[r][1:]
    _degrades(ex, dataclasses.replace(plan, save_op_calls=tuple(calls)), rf"{op}: called more than the {n - 1} time",
              op)


def test_a_plan_without_save_ops_installs_no_policy():
    ex, graph, plan = setup("gpt")
    plain = scheduler.solve(graph, budget=SETUPS["gpt"][1], solver="dp", selective=False)
    assert not plain.saved and not plain.save_ops
    scheduler.apply(ex.model, plain)
    try:
        assert all(w.policy is None for w in region_wrappers(ex.model) if hasattr(w, "policy"))
    finally:
        scheduler.remove(ex.model)


def test_cli_solve_writes_save_ops_and_apply_verifies(tmp_path, capsys):
    g, p = tmp_path / "g.json", tmp_path / "plan.json"
    assert main(["trace", "gpt", "--layers", "2", "--width", "64", "--heads", "4", "--seq", "128", "--batch", "4",
                 "-O", "vocab=128", "-o", str(g)]) == 0
    assert main(["solve", str(g), "--budget", "0.7", "--solver", "dp", "-S", "selective=true", "-o", str(p)]) == 0
    data = json.loads(p.read_text())
    assert data.get("saved") and any(data.get("save_ops", []))
    capsys.readouterr()
    code = main(["apply", str(p), "--verify", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(x for x in out.splitlines() if "max gradient difference" in x)
    assert line.split()[-1] == "0", line
