"""Tracing real models: memory truth, FLOPs, the Traced contract, meta models, errors."""

import json

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import graphs
from graphs import HOLDS_OP
import scheduler
from scheduler.measuring.storages import measure_peak, measure_step
from scheduler.models import Example, build, hf_configs
from scheduler.tracing.tracer import TraceError, TraceMismatch, capture
from scheduler.tracing.costs import CPU_ATTENTION_FLOPS
from solvers import simulate

CASES = {
    "gpt": dict(layers=2, width=64, heads=4, vocab=500, batch=2, seq=32),
    "resnet": dict(batch=2, image_size=32),
    "unet": dict(levels=2, width=8, image_size=32),
    "vgg19": dict(width=8, hidden=64, image_size=32),
    # GPT2LMHeadModel at width 64 and vocabulary 512 (_small_gpt2): GPT-2 small's 768 x 50257 took seconds per
    # step and trace and left the blocks a sliver of the peak the measurement compares
    "hf:gpt2": dict(n_layer=2, n_embd=64, n_head=2, vocab_size=512, batch=2, seq=32),
    "hf:llama-tiny": dict(seq=32),
}


def _small_gpt2(batch: int, seq: int, **fields) -> Example:
    """``build("hf:gpt2", ...)`` with the config's fields reduced (``build`` takes layers, batch and seq only)."""
    config = hf_configs.hf_config("gpt2", **{**hf_configs.HF_CONFIGS["gpt2"].build_fields, **fields})  # as build's
    config._attn_implementation = "sdpa"
    model = hf_configs.build_hf_model(config, device="cpu").train()
    args, kwargs = hf_configs.hf_inputs(config, batch, seq, device="cpu")
    return Example("hf:gpt2", model, tuple(args), dict(kwargs), hf_configs.hf_loss, dict(fields, batch=batch, seq=seq))


@pytest.fixture(scope="module", params=list(CASES))
def traced_case(request):
    torch.manual_seed(0)
    opts = CASES[request.param]
    ex = _small_gpt2(**opts) if request.param == "hf:gpt2" else build(request.param, **opts)
    traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op")
    return request.param, ex, traced


def test_store_all_peak_matches_a_measured_cpu_step_within_10_percent(traced_case):
    """Against the allocator's peak: the default trace counts op workspaces, which the
    storage count (``measure_step``) does not see."""
    from scheduler.measuring.steps import allocator_step_peak

    name, ex, traced = traced_case
    measured = allocator_step_peak(ex.model, ex.model, ex.args, ex.kwargs, ex.loss)
    for gran in ("op", "fold"):  # exact up to the allocator's own few bytes
        predicted = simulate(traced.regroup(gran).graph).peak_bytes
        assert abs(predicted - measured) < 0.02 * measured, f"{name} at {gran}: predicted {predicted}, measured {measured}"
    # A module-depth graph merges nodes and may only over-count: a merged node holds at once what its members
    # held in turn, its backward's buffers (workspace_bytes: the members' workspaces and internal gradients) and
    # its parameters' gradients. So the over-count is bounded by the largest merged node's two, not by a share of
    # the peak: the workspaces are the CPU's kernels' (unet at depth 3: +11.3 % on AVX-512, +15.2 % with oneDNN
    # and ATen limited to AVX2, as on an AVX2 EPYC, against a fixed 15 % that failed there; issue 33 item 8).
    graph = traced.regroup(3).graph
    merged = [nd for nd in graph.nodes if len(nd.members) > 1]
    bound = max((nd.workspace_bytes + nd.param_bytes for nd in merged), default=0)
    over = simulate(graph).peak_bytes - simulate(traced.regroup("op").graph).peak_bytes
    assert 0 <= over <= bound, f"{name} at depth 3: {over} B over the op graph, bound {bound}"


def test_flops_agree_with_flop_counter_over_eager_forward_and_backward(traced_case):
    name, ex, traced = traced_case
    # the tracer's counter knows SDPA's CPU flash kernel too (CPU_ATTENTION_FLOPS: FlopCounterMode lacks it)
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as fc:
        loss = ex.step_loss()
        fwd = fc.get_total_flops()
        loss.backward()
    g = traced.graph
    # Ops FlopCounterMode has no formula for are charged per element, kept apart (NOTE [ Ops without a FLOP formula ]).
    est_fwd = sum(r.estimated_fwd_flops for r in traced.records)
    estimated = g.meta["estimated_flops"]
    assert estimated == sum(r.estimated_flops for r in traced.records) > 0
    assert g.total_fwd_flops() + g.total_bwd_flops() - estimated == fc.get_total_flops()
    assert g.total_fwd_flops() - est_fwd == fwd


def test_traced_contract_members_parameters_and_calling(traced_case):
    name, ex, traced = traced_case
    fx_names = [n.name for n in traced.gm.graph.nodes if n.op not in ("placeholder", "output")]
    flat = [m for ms in traced.members for m in ms]
    assert flat == fx_names  # contiguous runs covering every compute node once, in order
    assert all(nd.members == ms for nd, ms in zip(traced.graph.nodes, traced.members))
    for gran in ("fold", 2):
        other = traced.regroup(gran)
        assert [m for ms in other.members for m in ms] == fx_names
        assert len(other.graph) <= len(traced.graph)
    gm_params = {id(p) for p in traced.gm.parameters()}
    assert gm_params <= {id(p) for p in ex.model.parameters()}
    assert len(gm_params) == len({id(p) for p in ex.model.parameters()})
    assert traced.placeholders == tuple(n.name for n in traced.gm.graph.nodes if n.op == "placeholder")
    with torch.random.fork_rng(), torch.no_grad():
        ex.model.eval()
        try:
            expected = ex.step_loss()
            got = traced(*ex.args, **ex.kwargs)
            flat_in = traced.flatten_inputs(*ex.args, **ex.kwargs)
            interp = torch.fx.Interpreter(traced.gm).run(*flat_in) if traced.method == "fx" else None
        finally:
            ex.model.train()
    if name in ("resnet", "unet"):
        return  # BatchNorm in eval mode was traced in train mode: values differ by design
    assert len(flat_in) == len(traced.placeholders)
    # eval() does not change a graph traced in train mode for models without BatchNorm only when
    # dropout is off; compare shapes, and values where the graph has no dropout.
    assert got.shape == expected.shape


def test_graph_json_round_trip(traced_case, tmp_path):
    name, ex, traced = traced_case
    path = tmp_path / "g.json"
    graphs.save(traced.graph, path)
    back = graphs.load(path)
    assert back == traced.graph and back.fingerprint() == traced.graph.fingerprint()
    assert json.loads(path.read_text())["meta"]["inputs"]


def test_flags_and_costs_of_a_built_in_transformer():
    torch.manual_seed(0)
    ex = build("gpt", **CASES["gpt"])
    g = capture(ex.model, ex.args, ex.kwargs, granularity="op").graph
    stochastic = [n for n in g.nodes if n.stochastic]
    assert stochastic and all("dropout" in n.op for n in stochastic)
    assert all(n.saved_bytes > 0 for n in stochastic)  # the mask
    ln = [n for n in g.nodes if n.op.startswith("aten.layer_norm")]
    assert ln and all(n.saved_bytes > 0 and n.saves_inputs for n in ln)  # mean/rstd, and its input
    assert g.param_bytes == sum(p.numel() * 4 for p in ex.model.parameters())  # tied weight once
    assert sum(n.param_bytes for n in g.nodes) == g.param_bytes
    assert g.meta["inputs"][0]["shape"] == [2, 32] and g.meta["dtype"] == "float32"


def test_batchnorm_is_stateful_and_merged_groups_keep_the_peak():
    torch.manual_seed(0)
    ex = build("resnet", **CASES["resnet"])
    traced = capture(ex.model, ex.args, ex.kwargs, granularity="op")
    assert any(n.stateful and "bn" in n.module for n in traced.graph.nodes)
    assert not any(n.stateful for n in traced.graph.nodes if "conv" in n.module)
    op_peak = simulate(traced.graph).peak_bytes
    merged = traced.regroup(2).graph
    assert len(merged) < len(traced.graph) / 3
    assert abs(simulate(merged).peak_bytes - op_peak) / op_peak < 0.10
    assert merged.total_fwd_flops() == traced.graph.total_fwd_flops()


def test_meta_llama_traces_without_allocating_and_matches_cpu_costs():
    cpu = build("hf:llama-tiny", seq=32)
    meta = build("hf:llama-tiny", seq=32, device="meta")
    with _RealAllocations() as real:
        g = scheduler.trace(meta.model, meta.args, meta.kwargs, loss=meta.loss, granularity="fold")
    # a meta trace is for a GPU by default: the CPU model traced for the same card (NOTE [ CUDA blocks ])
    ref = scheduler.trace(cpu.model, cpu.args, cpu.kwargs, loss=cpu.loss, granularity="fold",
                          target=g.meta["target"]["device"])
    assert all(p.device.type == "meta" for p in meta.model.parameters())
    assert real.largest < 4096  # no weight- or activation-sized real tensor (the smallest weight is 64 KiB)
    assert g.param_bytes == ref.param_bytes
    # transformers takes a slightly different mask path on meta (no .item()): a few nodes differ; its eager forward
    # reads a value (``.item()``), which a meta tensor has not, so the meta graph has no forward holds
    # (NOTE [ Forward holds ])
    assert not any(nd.op == HOLDS_OP for nd in g.nodes)
    assert abs(len(g) - sum(nd.op != HOLDS_OP for nd in ref.nodes)) <= 4
    assert abs(simulate(g).peak_bytes - simulate(ref).peak_bytes) <= 0.02 * simulate(ref).peak_bytes
    # attention: CPU runs the fused flash-for-CPU kernel, meta the math path (matmuls counted)
    assert abs(g.total_fwd_flops() - ref.total_fwd_flops()) <= 0.1 * ref.total_fwd_flops()


class _RealAllocations(TorchDispatchMode):
    """Largest real (neither fake nor meta) tensor any op produced."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and t.device.type != "meta":
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _DataDependent()

    def forward(self, x):
        return self.inner(x).sum()


class _DataDependent(nn.Module):
    def forward(self, x):
        if x.sum().item() > 0:
            return x * 2
        return x.nonzero().float().sum() * x


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return (self.lin(x) * self.calls).sum()


def test_untraceable_model_error_names_the_module_and_what_to_try():
    with pytest.raises(TraceError) as info:
        capture(_Branchy(), (torch.randn(3, 4),))
    msg = str(info.value)
    assert "inner" in msg and "_DataDependent" in msg and "What to try" in msg


class _LabelledLoss(nn.Module):
    """A classifier computing its own loss as transformers' DeBERTa does: only the rows with a label."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x, labels=None):
        logits = self.fc(x)
        if labels is None:
            return logits
        rows = (labels >= 0).nonzero()
        if rows.size(0) > 0:
            return F.cross_entropy(logits[rows[:, 0]], labels[rows[:, 0]])
        return logits.sum() * 0


def test_a_loss_from_labels_that_cannot_trace_says_to_trace_without_labels():
    model, x, labels = _LabelledLoss(), torch.randn(4, 8), torch.tensor([0, 2, -1, 1])
    with pytest.raises(TraceError, match=r"trace without labels= and pass loss=") as info:
        capture(model, (x,), {"labels": labels})
    assert "LayerDrop" in str(info.value)
    with pytest.raises(TraceError) as info:  # no labels given: only what every data-dependent branch gets
        capture(_Branchy(), (torch.randn(3, 4),))
    assert "trace without labels=" not in str(info.value)
    capture(model, (x,), loss=lambda out: F.cross_entropy(out, labels, ignore_index=-1))  # as it says: traces


def test_graph_that_differs_from_eager_is_refused():
    with pytest.raises(TraceMismatch, match="differs from the eager model"):
        capture(_Counter(), (torch.randn(2, 4),), method="fx")


def test_measure_peak_counts_storages_once_and_frees_them():
    x = torch.randn(256, 256)

    def work():
        a = x * 2          # 256 KiB
        b = a.view(-1)     # a view: no new bytes
        c = b + 1          # 256 KiB
        del a, b
        return c.sum()

    m = measure_peak(work, live=[x], timeline=True)
    assert m.base_bytes == x.numel() * 4
    assert m.peak_bytes == m.base_bytes + 2 * x.numel() * 4
    assert m.end_bytes == m.base_bytes + 4  # only the returned scalar is alive


# ------------------------------------------------------------ determinism
def _trace_dict(name: str, device: str, **options) -> dict:
    """The traced graph without what only a real device measures (op workspaces, the eager
    lifetimes behind ``Span.extra_bytes``, the CPU generator's state): those are left out of the
    fingerprint too. Costs are priced for one named device: by default a meta trace prices for the
    default GPU and a CPU trace for this CPU."""
    torch.manual_seed(0)
    ex = build(name, device=device, **options)
    d = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, workspaces="none", cost_device="h100").graph.to_dict()
    d["spans"] = [sp[:3] for sp in d.get("spans", [])]
    d.pop("rng_state_bytes", None)  # the CPU generator's state: 0 on meta (NOTE [ RNG state per region ])
    return d


@pytest.mark.parametrize("name, options", [
    ("vgg19", dict(width=8, hidden=64, image_size=32, batch=3)),
    ("gpt", dict(layers=1, width=32, heads=2, vocab=100, batch=2, seq=16)),
])
def test_retracing_gives_the_same_graph_whatever_the_device_and_the_garbage_collector(name, options):
    """The cost graph is a function of (model, inputs, granularity): the max-batch protocol traces on meta and
    applies on CPU, so any field depending on allocation addresses or GC timing would refuse a valid plan."""
    import gc

    first = _trace_dict(name, "meta", **options)
    again = _trace_dict(name, "cpu", **options)
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # collect cycles all the time: storages die at other moments
    try:
        busy = _trace_dict(name, "cpu", **options)
    finally:
        gc.set_threshold(*old)
    for other in (again, busy):
        diff = [k for k, (a, b) in enumerate(zip(first["nodes"], other["nodes"])) if a != b]
        assert other == first, f"{name}: nodes {diff[:5]} differ, e.g. {first['nodes'][diff[0]] if diff else ''}"
    assert graphs.Graph.from_dict(busy).fingerprint() == graphs.Graph.from_dict(first).fingerprint()
    assert any(n["workspace_bytes"] > 0 for n in first["nodes"])  # measured backward peaks are compared too


def test_a_plan_solved_on_a_meta_trace_applies_to_the_real_model_with_the_check_on():
    """The compare helper's failing path (VGG-19 max batch): graph on meta, plan, apply on CPU with check=True."""
    import solvers

    opts = dict(width=8, hidden=64, image_size=32, batch=4)
    torch.manual_seed(0)
    meta = build("vgg19", device="meta", **opts)
    graph = capture(meta.model, meta.args, meta.kwargs, loss=meta.loss).graph
    store_all = simulate(graph).peak_bytes
    plan = solvers.solve(graph, int(0.95 * store_all), solver="dp")
    assert plan.regions
    torch.manual_seed(0)
    ex = build("vgg19", **opts)
    module = scheduler.apply(ex.model, plan)  # check=True: module paths, classes and parameter count agree
    assert module is ex.model
    ex.step_loss().backward()
    assert all(p.grad is not None for p in ex.model.parameters())


def test_retrace_after_a_training_step_gives_the_same_graph():
    # After a step every parameter has a .grad; the trace must not measure accumulation into it.
    from scheduler.models import build as build_model

    ex = build_model("unet", levels=2, width=8, image_size=32)
    first = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss).graph
    ex.step_loss().backward()
    assert all(p.grad is not None for p in ex.model.parameters())
    again = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss).graph
    assert again.to_dict() == first.to_dict()


def test_transformer_encoder_is_traced_through(caplog):
    """NOTE [ Opaque torch modules ]: torch.fx keeps nn.TransformerEncoder as one node; auto uses export."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(16, 32)
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, x):
            return self.enc(self.inp(x)).square().mean()

    x = torch.randn(2, 8, 16)
    traced = capture(Net(), (x,), {})
    assert traced.method == "export" and len(traced.graph) > 30
    with caplog.at_level("WARNING"):
        flat = capture(Net(), (x,), {}, method="fx")
    assert len(flat.graph) < 8 and "--method export" in caplog.text
