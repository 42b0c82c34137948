"""The storage count's own effect on a step (NOTE [ Counting like simulate ] in ``scheduler.measuring.storages``)."""

import torch
from torch.profiler import ProfilerActivity, profile

from scheduler.measuring.storages import measure_peak


def test_a_dispatch_mode_makes_gradient_accumulation_out_of_place():
    """Why the storage count can exceed a plain run by one gradient at such a step."""
    torch.manual_seed(0)
    lin, head = torch.nn.Linear(16, 64), torch.nn.Linear(64, 8)
    x = torch.randn(32, 16)

    def loss():
        h = lin(x)  # read by two branches: its gradient gets two contributions
        return (head(h).sum() + h.mean())

    first = loss()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        first.backward()
    plain = [e.name for e in prof.events() if e.name in ("aten::add", "aten::add_")]
    for p in (*lin.parameters(), *head.parameters()):
        p.grad = None  # no AccumulateGrad add_ in the second run either
    second = loss()
    under_mode = [op for op, _ in measure_peak(lambda: second.backward(), timeline=True).timeline
                  if op in ("aten.add.Tensor", "aten.add_.Tensor")]
    assert plain == ["aten::add_"]  # h's gradient: head's contribution added into mean's, in place
    assert under_mode == ["aten.add.Tensor"]  # the same sum, as a new tensor
