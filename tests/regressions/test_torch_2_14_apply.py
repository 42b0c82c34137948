"""torch 2.14 defines ``torch.autograd.Function.apply`` in C: a descriptor without ``__func__``.

The tracer wraps ``Function.apply`` while exporting (NOTE [ Custom autograd functions ] in
``scheduler.tracing.capture``) and read ``apply.__func__``: under torch 2.14.1 every export failed
with "'classmethod_descriptor' object has no attribute '__func__'", so every model that torch.fx
could not trace (all 13 third-party models of ``benchmarks/thirdparty.py``) failed to trace. The
project pins torch 2.13, where ``apply`` is a Python classmethod; this test puts a descriptor of
the C kind (bound by ``__get__``, no ``__func__``) in its place.
"""

from __future__ import annotations

import torch
from torch import nn

from scheduler.tracing.tracer import capture


class Halve(torch.autograd.Function):
    """A custom function that keeps nothing for its backward."""

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        return x * 0.5

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        return g * 0.5


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + Halve.apply(torch.relu(layer(x)))
        return x.square().mean()


class _CDescriptor:
    """Binds like a classmethod and has no ``__func__``, as torch 2.14's ``apply`` does."""

    def __init__(self, method: classmethod) -> None:
        self._method = method

    def __get__(self, obj, cls=None):  # noqa: ANN001, ANN204
        return self._method.__get__(obj, cls)


def test_export_with_a_c_defined_apply(monkeypatch):
    original = torch.autograd.Function.__dict__["apply"]
    monkeypatch.setattr(torch.autograd.Function, "apply", _CDescriptor(original))
    assert not hasattr(torch.autograd.Function.__dict__["apply"], "__func__")
    torch.manual_seed(0)
    model, x = Mlp().train(), torch.randn(8, 16)
    tr = capture(model, (x,), method="export", granularity="op")
    assert sum(nd.op == "flat_apply" for nd in tr.graph.nodes) == 3  # kept whole, not inlined
    assert torch.autograd.Function.__dict__["apply"].__class__ is _CDescriptor  # put back as it was
    ref = model(x)
    assert torch.equal(ref.detach(), tr(x).detach())
