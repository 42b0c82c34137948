"""The measured recompute counts what re-ran (NOTE [ Counting what a selective policy served ])."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from scheduler.applying.selective import RegionPolicy, selective_contexts
from scheduler.comparing import peers
from scheduler.comparing.run import Row, Workload, _Bench
from scheduler.measuring.profiler import profile_step
from scheduler.applying.selective import count_step_flops


class _Two(nn.Module):
    def __init__(self, keep):
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)
        self.keep = keep

    def body(self, x):
        return self.b(torch.relu(self.a(x)))

    def forward(self, x):
        if self.keep is None:
            return self.body(x)
        ctx = {"context_fn": selective_contexts(RegionPolicy("r", self.keep), ())} if self.keep else {}
        return checkpoint(self.body, x, use_reentrant=False, **ctx)


_BOTH = [("aten.addmm.default", 0), ("aten.addmm.default", 1)]


def _step(model, x):
    def run():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
    return run


def test_served_calls_are_not_counted_as_recomputed():
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    model = _Two(None)
    plain, _ = count_step_flops(_step(model, x))
    model.keep = []  # a plain checkpoint: the first product runs again (the second is where it stops)
    ckpt, seen = count_step_flops(_step(model, x))
    assert ckpt - plain == 2 * 8 * 32 * 32 and seen["served_calls"] == 0
    model.keep = _BOTH  # both products kept: the recompute serves one and stops before the other
    kept, seen = count_step_flops(_step(model, x))
    assert kept == plain, (kept, plain)
    assert seen["kept_calls"] == 2 and seen["served_calls"] == 1 and seen["served_flops"] == 2 * 8 * 32 * 32
    # the profiler, as the comparison used to count, sees more recompute than the plain checkpoint's
    prof = profile_step(_step(model, x), baseline_bytes=0).kernel_flops
    model.keep = None
    assert prof > profile_step(_step(model, x), baseline_bytes=0).kernel_flops + (ckpt - plain)


def test_comparison_row_counts_what_reran():
    torch.manual_seed(0)
    model = _Two(None)
    wl = Workload("two", model, (torch.randn(8, 32),), loss=lambda out: out.sum())
    bench = _Bench(wl, repeats=1, warmup=0)
    selective = _Two(_BOTH)
    selective.load_state_dict(model.state_dict())
    selective.a, selective.b = model.a, model.b  # the same parameters, as a planned model shares them
    row, _ = bench.measure(peers.Prepared(forward=selective, note="kept both"), Row("ours", "ours"))
    assert row.measured_recompute_ratio == 0.0 and row.served_calls == 1, row
