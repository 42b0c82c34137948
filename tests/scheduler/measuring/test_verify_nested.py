"""``scheduler.verify`` and ``ckpt apply PLAN --verify`` on nested plans (issue 33, item 3): they ran the plan's
forward with the plan applied and its backward with it removed, so an outer region's recompute called its inner
modules plain (torch's CheckpointError; NOTE [ A plan switched on for one step ] in scheduler.applying.modules).
A step that fails inside verify is one VerifyError line, never a torch traceback."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import scheduler
from scheduler.applying import modules as applying_modules
from scheduler.cli import main
from scheduler.measuring.verification import VerifyError
from solvers import Plan, load_plan
from solvers.model.nested import inner_menu


def _nested_blocks(graph, prefix: str, layers: int) -> Plan:
    """Every block a region, with all of its child calls nested (NOTE [ The menu of inner regions ])."""
    blocks = [(sp.first, sp.last) for sp in graph.spans if sp.module in {f"{prefix}.{i}" for i in range(layers)}]
    inner = tuple(r for b in blocks for r in inner_menu(graph, *b))
    assert len(blocks) == layers and len(inner) >= 2 * layers
    return Plan.from_regions(graph, blocks, inner=inner)


def test_verify_passes_on_a_nested_gpt2_plan():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, 256, (1, 64))
    kwargs = {"input_ids": ids, "labels": ids}
    graph = scheduler.trace(model, (), kwargs, loss=lambda out: out.loss)
    plan = _nested_blocks(graph, "transformer.h", 2)
    assert any(m.endswith(".ln_1") for m in plan.inner_modules)  # the layer norms nest too (the shape)
    v = scheduler.verify(model, plan, (), kwargs, loss=lambda out: out.loss, graph=graph, steps=1, warmup=0)
    assert v.grads_equal()  # bitwise
    assert 0 < v.measured_peak_bytes <= v.predicted_peak_bytes
    assert not any("forward" in m.__dict__ for m in model.modules())  # verify leaves the model as it was


@pytest.fixture(scope="module")
def nested_plan_file(tmp_path_factory) -> str:
    """A plan file for ``ckpt apply``: the CLI's gpt, every block a region with its child calls nested."""
    tmp_path = tmp_path_factory.mktemp("nested")
    g = tmp_path / "g.json"
    assert main(["trace", "gpt", "--layers", "2", "--width", "32", "--heads", "2", "--seq", "32", "-O", "vocab=64",
                 "-o", str(g)]) == 0
    graph = scheduler.load_graph(g)
    plan = _nested_blocks(graph, "blocks", 2)
    path = tmp_path / "p.json"
    plan.save(path)
    assert load_plan(path).inner == plan.inner
    return str(path)


def test_cli_apply_verify_passes_on_a_nested_plan(nested_plan_file, capsys):
    path = nested_plan_file
    capsys.readouterr()
    code = main(["apply", path, "--verify", "--steps", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("max gradient difference")] == ["0"]


def test_a_step_failing_inside_verify_is_one_line(nested_plan_file, capsys, monkeypatch):
    # The bug itself, brought back: the plan removed as soon as the planned forward returns.
    path = nested_plan_file
    monkeypatch.setattr(applying_modules._Planned, "_remove_after_backward", lambda self, out: False)
    capsys.readouterr()
    code = main(["apply", path, "--verify", "--steps", "1"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ckpt apply: error:")]
    assert code == 2 and len(lines) == 1, err
    assert "the step with the plan failed with CheckpointError" in lines[0]
    assert "Traceback" not in err


def test_verify_names_the_step_that_failed():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 1)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x))).sum()

    class Once(nn.Module):  # a recompute (a call inside the backward) fails, as torch's errors do, from deep inside
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if torch._C._current_graph_task_id() != -1:
                raise RuntimeError("something deep inside torch\nsecond line of a long message")
            return self.inner(x)

    torch.manual_seed(0)
    net = Net()
    net.a = Once(net.a)
    x = torch.randn(4, 8)
    graph = scheduler.trace(net, (x,))
    span = next((sp.first, sp.last) for sp in graph.spans if sp.module == "a")
    plan = Plan.from_regions(graph, [span])
    with pytest.raises(VerifyError) as info:
        scheduler.verify(net, plan, (x,), graph=graph, steps=1, warmup=0)
    text = str(info.value)
    assert "\n" not in text and "the step with the plan failed with RuntimeError: something deep inside torch" in text
    assert isinstance(info.value.__cause__, RuntimeError)  # the whole traceback stays reachable
    assert json.dumps(text)  # a plain string
