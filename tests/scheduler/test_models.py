"""The example-model registry: built-ins, hf:NAME configs, package.module:factory."""

import sys

import pytest
import torch

from graphs import CkptError
from scheduler.models import Example, UnknownModel, build, describe, parse_dtype

SMALL = {
    "gpt": dict(layers=1, width=32, heads=2, vocab=100, seq=16, batch=2),
    "resnet": dict(batch=2, image_size=32),
    "unet": dict(levels=2, width=8, image_size=32),
    "vgg19": dict(width=8, hidden=64, image_size=32),
    "hf:gpt2": dict(layers=1, seq=16),
    "hf:llama-tiny": dict(seq=16),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_each_model_builds_and_gives_a_scalar_loss_with_gradients(name):
    torch.manual_seed(0)
    ex = build(name, **SMALL[name])
    assert isinstance(ex, Example) and ex.model.training
    loss = ex.step_loss()
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in ex.model.parameters() if p.requires_grad)


def test_options_shape_the_inputs():
    ex = build("gpt", layers=1, width=32, heads=2, vocab=100, seq=24, batch=3)
    assert tuple(ex.args[0].shape) == (3, 24)
    ex = build("resnet", image_size=48, batch=1, dtype="bf16")
    assert tuple(ex.args[0].shape) == (1, 3, 48, 48) and ex.args[0].dtype == torch.bfloat16
    assert next(ex.model.parameters()).dtype == torch.bfloat16


def test_meta_device_allocates_no_weights():
    ex = build("gpt", layers=2, width=64, heads=2, vocab=1000, seq=16, device="meta")
    assert all(p.device.type == "meta" for p in ex.model.parameters())


def test_factory_by_import_path():
    ex = build("scheduler.models.gpt:build", layers=1, width=32, heads=2, vocab=50, seq=8)
    model, args, kwargs = ex
    assert isinstance(model, torch.nn.Module) and "targets" in kwargs


def test_factory_in_the_current_directory(tmp_path, monkeypatch):
    """`ckpt trace mymodel:build` next to mymodel.py finds it, as `python -m` would."""
    (tmp_path / "my_zoo_model.py").write_text(
        "import torch\n"
        "def build():\n"
        "    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))\n"
        "    return net, (torch.randn(2, 4),), {}, lambda out: out.sum()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    ex = build("my_zoo_model:build")
    assert isinstance(ex.model, torch.nn.Sequential) and ex.loss is not None
    with pytest.raises(UnknownModel, match="current directory"):
        build("no_such_zoo_model:build")


def test_unknown_model_and_bad_option_are_clear_errors():
    with pytest.raises(UnknownModel, match="built-in: gpt, resnet, unet, vgg19"):
        build("alexnet")
    with pytest.raises(UnknownModel, match="hf:gpt2"):
        build("hf:bert-huge")
    with pytest.raises(CkptError, match="does not take option"):
        build("vgg19", seq=12)
    with pytest.raises(CkptError, match="unknown dtype"):
        parse_dtype("float7")


def test_describe_lists_builtins_and_hf_configs_with_options():
    rows = {name: opts for name, _desc, opts in describe()}
    assert {"gpt", "resnet", "unet", "vgg19", "hf:gpt2", "hf:llama-tiny", "hf:llama-7b"} <= set(rows)
    assert rows["gpt"]["layers"] == 12 and rows["gpt"]["width"] == 768 and rows["gpt"]["vocab"] == 50257
