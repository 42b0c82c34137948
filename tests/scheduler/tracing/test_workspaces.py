"""Measured op workspaces (NOTE [ Op workspaces ] in ``scheduler.tracing.workspaces``).

Kernels hold buffers inside the call that no traced tensor shows (a
convolution's backward, attention, normalisations, in the forward and the
backward); without them the prediction of a step is below what the
allocator reaches.
"""

import torch

from scheduler.applying.graph import apply
from scheduler.comparing.workloads import workload
from scheduler.measuring.profiler import profile_step
from scheduler.measuring.storages import live_bytes_of
from scheduler.tracing.tracer import capture
from solvers import Plan, simulate


def _allocator_peak(wl, run) -> int:
    for p in wl.model.parameters():
        p.grad = None
    tensors = list(wl.model.parameters()) + list(wl.model.buffers())
    tensors += [t for t in (*wl.args, *wl.kwargs.values()) if isinstance(t, torch.Tensor)]

    def step() -> None:
        out = run(*wl.args, **wl.kwargs)
        value = wl.loss(out) if run is wl.model and wl.loss else out
        del out
        value.backward()

    return profile_step(step, baseline_bytes=live_bytes_of(tensors)).peak_bytes


def test_measured_conv_workspaces_reach_the_allocator_peak():
    torch.manual_seed(0)
    wl = workload("vgg19", quick=True)
    plain = capture(wl.model, wl.args, wl.kwargs, loss=wl.loss, workspaces="none").graph
    measured = capture(wl.model, wl.args, wl.kwargs, loss=wl.loss, workspaces="measure").graph
    conv_modules = {n for n, m in wl.model.named_modules() if isinstance(m, torch.nn.Conv2d)}
    convs = [i for i, nd in enumerate(measured.nodes) if nd.module in conv_modules]
    grown = [i for i, (a, b) in enumerate(zip(plain.nodes, measured.nodes)) if b.workspace_bytes > a.workspace_bytes]
    assert convs and set(convs) <= set(grown)  # every convolution (and whatever else holds a buffer)
    assert measured.meta["workspaces"] == "cpu"
    assert measured.fingerprint() == plain.fingerprint()  # a plan for one applies to the other

    peak = _allocator_peak(wl, wl.model)
    assert simulate(plain, None, record=False).peak_bytes < peak  # the gap the workspaces close
    assert simulate(measured, None, record=False).peak_bytes >= peak

    # A plan on the measured graph applies (same fingerprint) and predicts the allocator; the region
    # draws no random numbers, so it stores no generator state (NOTE [ RNG state per region ]).
    first = convs[len(convs) // 2]
    plan = Plan.from_regions(measured, [(first, first + 2)])
    assert not any(measured.nodes[i].stochastic for i in range(first, first + 3))
    applied = apply(wl.model, plan, wl.args, wl.kwargs, loss=wl.loss)
    peak = _allocator_peak(wl, applied)
    assert simulate(measured, plan, record=False).peak_bytes >= peak
    assert simulate(plain, plan, record=False).peak_bytes < peak


class _Attention(torch.nn.Module):
    """Layer norm, then SDPA (its CPU kernels allocate buffers inside the call), then a projection."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def test_a_non_convolution_op_that_allocates_inside_gets_its_workspace():
    torch.manual_seed(0)
    model = _Attention().train()
    x = torch.randn(4, 64, 32)
    kw = dict(loss=lambda y: y.square().mean(), granularity="op")
    plain = capture(model, (x,), **kw, workspaces="none").graph
    measured = capture(model, (x,), **kw, workspaces="auto").graph  # auto: measured on the CPU
    assert measured.meta["workspaces"] == "cpu" and plain.meta.get("workspaces") is None
    sdpa = [i for i, nd in enumerate(measured.nodes) if "scaled_dot_product" in nd.op]
    assert sdpa and all(measured.nodes[i].workspace_bytes > plain.nodes[i].workspace_bytes for i in sdpa)
    assert not any(measured.nodes[i].stochastic for i in sdpa)  # dropout_p=0 draws nothing
    assert measured.fingerprint() == plain.fingerprint()


def test_measured_workspaces_are_cached_per_signature():
    from scheduler.tracing.workspaces import WorkspaceProbe

    probe = WorkspaceProbe()
    a, b = torch.randn(8, 16, 32), torch.randn(8, 16, 32)
    ln = torch.ops.aten.native_layer_norm.default
    s1 = probe.note(ln, (a, [32], None, None, 1e-5), {})
    s2 = probe.note(ln, (b, [32], None, None, 1e-5), {})
    s3 = probe.note(ln, (a.transpose(0, 1), [32], None, None, 1e-5), {})  # other strides: another signature
    assert s1 == s2 and s3 != s1 and len(probe.specs) == 2
    assert probe.note(torch.ops.aten.add.Tensor, (a, b), {}) is None  # pointwise: nothing to measure
    deltas = probe.measure(torch.device("cpu"))
    out_bytes = a.numel() * 4 + 2 * 8 * 16 * 4  # output, mean and rstd
    assert deltas[s1] >= out_bytes


def test_measuring_workspaces_leaves_the_users_generator_where_it_was():
    """The probe runs dropout's kernels for real; the user's next mask must not change because we traced."""
    from scheduler.models import build

    torch.manual_seed(0)
    ex = build("gpt", layers=1, width=32, heads=2, vocab=64, seq=16, batch=2)
    ex.model.train()
    rng = torch.get_rng_state()
    g = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op", workspaces="measure")
    assert any(nd.stochastic for nd in g.graph.nodes)
    assert torch.equal(rng, torch.get_rng_state())
