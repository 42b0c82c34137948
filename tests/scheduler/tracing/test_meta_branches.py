"""A forward that reads its device, built on ``meta`` and traced for the CPU: the graph is captured on meta and
measured on fake CPU tensors, so meta's branch runs on the CPU. transformers' MoE routing (Mixtral) calls
``histc`` on ints unless the device is the CPU, which the CPU's kernel refuses: a clear error that says what to do,
not a bare RuntimeError from the fake-tensor kernels."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import scheduler
from scheduler.tracing.capture import TraceError


class _Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.proj = nn.Linear(8, 4), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        picked = self.gate(x).argmax(-1)
        picked = picked.float() if x.device.type == "cpu" else picked.int()  # as transformers' moe.py does
        counts = torch.histc(picked, bins=4, min=0, max=3)
        return self.proj(x) * (1 + counts.sum() * 0)


def test_a_meta_model_that_takes_another_branch_on_meta_says_how_to_trace_it():
    x = torch.randn(6, 8)
    assert scheduler.trace(_Routed(), (x,), {}, loss=lambda out: out.sum()).nodes  # on the CPU: traced
    with torch.device("meta"):
        model = _Routed()
    with pytest.raises(TraceError, match=r"built on meta could not be traced for cpu.*histogram_cpu.*target='H100'"):
        scheduler.trace(model, (x.to("meta"),), {}, loss=lambda out: out.sum(), target="cpu")
    graph = scheduler.trace(model, (x.to("meta"),), {}, loss=lambda out: out.sum(), target="H100")
    assert graph.meta["target"]["kind"] == "cuda"
