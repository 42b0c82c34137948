"""Roofline recompute costs (NOTE [ Roofline costs ] in ``scheduler.tracing.roofline``) and ``Node.fwd_cost``."""

import dataclasses
import json
import logging

import pytest
import torch

import solvers
from graphs import Graph, GraphError, Node, synthetic
from scheduler.models import build
from scheduler.tracing.tracer import TraceError, capture
from scheduler.tracing.costs import measure_ops
from scheduler.tracing.calibration import device_peaks
from scheduler.tracing.roofline import (DEVICES, TANH_GELU, DevicePeaks, UnknownDevice, kernel_time_s,
                                        lookup_device, record_time_s, roofline_records, slow_class)
from scheduler.tracing.target import resolve_target, target_peaks
from solvers import Plan, activation_budget_bytes

pytestmark = pytest.mark.usefixtures("fake_cpu")  # conftest: no test here measures this machine


# ------------------------------------------------------------------ the table
@pytest.mark.parametrize("reported, name", [
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("NVIDIA L4", "L4"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("NVIDIA GeForce RTX 3090", "RTX3090"),
    ("h100", "H100"), ("rtx 4090", "RTX4090"), ("A100-40GB", "A100-40GB"),
])
def test_device_names_as_cuda_reports_them_find_the_table_entry(reported, name):
    assert lookup_device(reported).name == name


def test_unknown_devices():
    assert lookup_device("NVIDIA L40S") is None  # not the L4
    assert lookup_device("") is None
    with pytest.raises(UnknownDevice, match="H200.*or cpu"):
        device_peaks("TPU v5")


def test_table_peaks_are_dense_datasheet_numbers():
    h100 = DEVICES["H100"]
    assert h100.peak("bfloat16") == pytest.approx(989e12) and h100.peak("float32") == pytest.approx(67e12)
    assert h100.peak("float64") == h100.peak("float32")  # a dtype the table lacks: float32's
    assert DEVICES["H200"].bytes_per_s > h100.bytes_per_s
    assert all(d.random_per_s is None for d in DEVICES.values())


def test_which_device_a_trace_is_priced_for(monkeypatch, caplog, fake_cpu):
    def peaks(device, target=None):
        return target_peaks(resolve_target(target, torch.device(device))).name

    assert peaks("meta") == "H100" and peaks("meta", "L4") == "L4" and peaks("cpu", "h200") == "H200"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 3090")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert peaks("cuda:0") == "RTX3090"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Imaginary GPU 9000")
    with caplog.at_level(logging.WARNING, logger="scheduler.tracing.target"):
        assert peaks("cuda:0") == "H100"
    assert "Imaginary GPU 9000" in caplog.text
    assert not fake_cpu and peaks("cpu").startswith("cpu") and fake_cpu


# ---------------------------------------------------------------- the formula
def test_kernel_time_is_the_higher_roof_plus_the_overhead():
    h100 = DEVICES["H100"]
    n = 4096
    mm = kernel_time_s(2 * n ** 3, 3 * n * n * 2, "bfloat16", h100)
    assert mm == pytest.approx(2 * n ** 3 / 989e12 + 5e-6)  # compute-bound
    gelu = kernel_time_s(0, 2 * n * n * 2, "bfloat16", h100)
    assert gelu == pytest.approx(2 * n * n * 2 / 3.35e12 + 5e-6)  # memory-bound
    cpu = DevicePeaks("cpu", {"float32": 1e11}, 2e10, 3e-6, random_per_s=1e8)
    drop = kernel_time_s(0, 9 * 10**6, "float32", cpu, randoms=10**6)
    assert drop == pytest.approx(10**6 / 1e8 + 3e-6)  # drawing the mask is the roof on this CPU
    with pytest.raises(ValueError, match="positive"):
        DevicePeaks("bad", {"float32": -1.0}, 1.0, 0.0)


class _Ops(torch.nn.Module):
    def forward(self, a, b):
        c = a @ b
        d = torch.nn.functional.gelu(c)
        return d.t()


def test_traced_kernels_matmul_compute_bound_elementwise_memory_bound_view_free():
    n = 2048
    gm = torch.fx.symbolic_trace(_Ops())
    a, b = torch.randn(n, n), torch.randn(n, n)
    records, _ = measure_ops(gm, [a, b])
    ops = {r.op.split(".")[-1] if "." in r.op else r.op: r for r in records}
    mm, gelu, view = ops["matmul"], ops["gelu"], ops["t"]
    assert [k[1] for k in mm.kernels] == [2 * n ** 3]
    assert mm.kernels[0][2] == 3 * n * n * 4  # reads a and b, writes c
    assert gelu.kernels == (("float32", 0, 2 * n * n * 4, 0),)
    assert view.kernels == ()
    h100 = DEVICES["H100"]
    priced, meta = roofline_records(records, h100, "float32")
    cost = {r.op: r.fwd_cost for r in priced}
    assert record_time_s(mm, h100) == pytest.approx(2 * n ** 3 / 67e12 + 5e-6)
    assert record_time_s(gelu, h100) == pytest.approx(2 * n * n * 4 / 3.35e12 + 5e-6)
    assert cost[view.op] == 0
    # FLOP-equivalents at the float32 peak: a compute-bound matmul costs about its FLOPs
    assert cost[mm.op] == pytest.approx(2 * n ** 3, rel=0.05)
    assert cost[gelu.op] > 100 * n * n  # far above its one "FLOP" per element
    assert meta["model"] == "roofline" and meta["device"] == "H100" and meta["flops_per_s"] == 67e12


# ------------------------------------------------- slow elementwise kernels
@pytest.mark.parametrize("op, cls", [
    ("aten.gelu.default", "gelu"), ("aten.gelu_.default", "gelu"), ("aten.gelu.default" + TANH_GELU, "gelu_tanh"),
    ("aten._softmax.default", "softmax"), ("aten._log_softmax.default", "log_softmax"),
    ("aten.native_layer_norm.default", "layer_norm"), ("aten.masked_fill.Scalar", "masked_fill"),
    ("aten.silu_.default", "silu"), ("aten.exp.default", "exp"), ("aten.add.Tensor", None),
    ("aten.expand.default", None), ("aten.exponential_.default", None), ("aten.softmax.int", None), (None, None),
])
def test_slow_classes_are_read_off_the_aten_op(op, cls):
    assert slow_class(op) == cls


def test_a_kernel_of_a_slow_class_moves_at_its_own_bandwidth():
    cpu = DevicePeaks("cpu", {"float32": 1e11}, 2e10, 3e-6, class_bytes_per_s={"gelu": 5e9, "layer_norm": 4e10})
    nbytes = 8 * 10**6
    assert kernel_time_s(0, nbytes, "float32", cpu, op="aten.gelu.default") == pytest.approx(nbytes / 5e9 + 3e-6)
    assert kernel_time_s(0, nbytes, "float32", cpu, op="aten.add.Tensor") == pytest.approx(nbytes / 2e10 + 3e-6)
    assert kernel_time_s(0, nbytes, "float32", cpu) == pytest.approx(nbytes / 2e10 + 3e-6)
    # a class measured faster than a copy is never priced above the copy's bandwidth
    assert kernel_time_s(0, nbytes, "float32", cpu, op="aten.native_layer_norm.default") == pytest.approx(
        nbytes / 2e10 + 3e-6)
    # a class with no figure (tanh GELU here) moves at the copy bandwidth; the named GPUs have none at all
    assert kernel_time_s(0, nbytes, "float32", cpu, op="aten.gelu.default" + TANH_GELU) == pytest.approx(
        nbytes / 2e10 + 3e-6)
    assert all(not d.class_bytes_per_s for d in DEVICES.values())
    assert DevicePeaks.from_dict(cpu.to_dict()) == cpu
    with pytest.raises(ValueError, match="class_bytes_per_s"):
        DevicePeaks("bad", {"float32": 1.0}, 1.0, 0.0, class_bytes_per_s={"gelu": 0.0})


class _Slow(torch.nn.Module):
    def forward(self, x):
        a = torch.nn.functional.gelu(x, approximate="tanh")
        b = torch.nn.functional.gelu(a)
        return torch.softmax(b, -1) + a


def test_a_traced_model_prices_its_slow_kernels_by_class():
    gm = torch.fx.symbolic_trace(_Slow())
    x = torch.randn(64, 256)
    records, _ = measure_ops(gm, [x])
    ran = [r for r in records if r.kernels]
    ops = sorted(op for r in ran for op in r.kernel_ops)
    assert ops == sorted(["aten.gelu.default" + TANH_GELU, "aten.gelu.default", "aten._softmax.default",
                          "aten.add.Tensor"])
    nbytes = 2 * x.numel() * 4
    cpu = DevicePeaks("cpu", {"float32": 1e11}, 2e10, 0.0,
                      class_bytes_per_s={"gelu": 5e9, "gelu_tanh": 2e9, "softmax": 4e9})
    want = {"aten.gelu.default" + TANH_GELU: nbytes / 2e9, "aten.gelu.default": nbytes / 5e9,
            "aten._softmax.default": nbytes / 4e9, "aten.add.Tensor": 3 * x.numel() * 4 / 2e10}
    for r in ran:
        assert record_time_s(r, cpu) == pytest.approx(sum(want[op] for op in r.kernel_ops))
    plain = DevicePeaks("cpu", {"float32": 1e11}, 2e10, 0.0)
    assert sum(record_time_s(r, cpu) for r in records) > 3 * sum(record_time_s(r, plain) for r in records)


# ------------------------------------------------------------- traced models
GPT = dict(layers=2, width=128, heads=4, vocab=512, batch=2, seq=64)


@pytest.fixture(scope="module")
def gpt_graphs():
    torch.manual_seed(0)
    ex = build("gpt", **GPT)
    ex.model.train()
    roof = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op", cost_device="H100").graph
    flops = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity="op", costs="flops",
                    cost_device="H100").graph
    return roof, flops


def _share(graph, word, costs):
    picked = sum(c for c, nd in zip(costs, graph.nodes) if word in nd.op)
    return picked / sum(costs)


@pytest.mark.parametrize("op", ["dropout", "gelu", "layer_norm"])
def test_memory_bound_ops_are_no_longer_free(gpt_graphs, op):
    roof, flops = gpt_graphs
    by_flops = _share(flops, op, flops.recompute_costs())
    by_time = _share(roof, op, roof.recompute_costs())
    assert by_time > 10 * by_flops
    matmuls = _share(roof, "linear", roof.recompute_costs())
    assert matmuls < _share(flops, "linear", flops.recompute_costs())


def test_roofline_is_the_default_and_keeps_the_fingerprint(gpt_graphs):
    roof, flops = gpt_graphs
    assert roof.meta["costs"]["model"] == "roofline" and roof.meta["costs"]["device"] == "H100"
    assert roof.meta["costs"]["flops_per_s"] == DEVICES["H100"].peak("float32")
    assert roof.meta["costs"]["peaks"]["bytes_per_s"] == DEVICES["H100"].bytes_per_s
    assert flops.meta["costs"]["model"] == "flops"
    assert [nd.fwd_cost for nd in flops.nodes] == [nd.fwd_flops for nd in flops.nodes]
    assert [nd.fwd_flops for nd in roof.nodes] == [nd.fwd_flops for nd in flops.nodes]
    assert roof.fingerprint() == flops.fingerprint()
    assert roof.content_hash() != flops.content_hash()


def test_predicted_recompute_time_is_the_cost_at_the_graph_rate(gpt_graphs, tmp_path):
    roof, _ = gpt_graphs
    with pytest.raises(solvers.InfeasibleBudget) as floor:
        solvers.solve(roof, 0, solver="ilp", time_limit_s=20)
    plan = solvers.solve(roof, floor.value.min_feasible_bytes, solver="ilp", time_limit_s=20)
    assert plan.regions and plan.recompute_time_s > 0
    assert plan.recompute_time_s == pytest.approx(plan.recompute_cost / 67e12)
    sim = solvers.simulate(roof, plan, record=False)
    assert sim.recompute_time_s == pytest.approx(plan.recompute_time_s)
    plan.save(tmp_path / "plan.json")
    assert solvers.load_plan(tmp_path / "plan.json").recompute_time_s == plan.recompute_time_s
    with pytest.raises(solvers.PlanError, match="recompute_time_s"):
        Plan.from_dict({**plan.to_dict(), "recompute_time_s": -1.0})


def test_graphs_without_a_rate_predict_no_time():
    g = synthetic.make("chain", 12, seed=0)
    plan = solvers.solve(g, activation_budget_bytes(g, 0.9), solver="dp")
    assert plan.regions and plan.recompute_time_s is None and solvers.simulate(g, plan).recompute_time_s is None


def test_a_meta_model_is_priced_for_a_named_device():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    x = torch.randn(8, 64, device="meta")
    assert capture(model, (x,)).graph.meta["costs"]["device"] == "H100"
    assert capture(model, (x,), cost_device="A100-80GB").graph.meta["costs"]["device"] == "A100-80GB"
    with pytest.raises(TraceError, match="unknown target .abacus.*A100-80GB"):
        capture(model, (x,), cost_device="abacus")


def test_a_cpu_model_is_priced_for_the_measured_cpu(fake_cpu):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    graph = capture(model, (torch.randn(4, 16),)).graph
    assert graph.meta["costs"]["device"].startswith("cpu") and graph.meta["costs"]["flops_per_s"] == 1e11
    assert "measured on this machine" in graph.meta["costs"]["peaks"]["source"]
    calls = list(fake_cpu)
    capture(model, (torch.randn(4, 16),))
    assert calls and fake_cpu == calls  # measured once, then read


# --------------------------------------------------------------- the field
def test_fwd_cost_defaults_to_fwd_flops_and_round_trips():
    old = Graph.from_dict({"nodes": [{"name": "a", "inputs": [], "out_bytes": 4, "fwd_flops": 7}]})
    assert old.nodes[0].fwd_cost == 7 and old.recompute_costs() == [7]
    g = old.with_nodes([dataclasses.replace(old.nodes[0], fwd_cost=99)])
    back = Graph.from_dict(json.loads(json.dumps(g.to_dict())))
    assert back == g and back.recompute_costs() == [99]
    assert g.fingerprint() == old.fingerprint() and g.content_hash() != old.content_hash()
    follows = dataclasses.replace(g.nodes[0], fwd_flops=5, fwd_cost=None)
    assert follows.fwd_cost == 5


@pytest.mark.parametrize("value", [-1, 1.5, "many", True, 2**62])
def test_fwd_cost_is_loaded_strictly(value):
    with pytest.raises(GraphError, match="fwd_cost"):
        Graph.from_dict({"nodes": [{"name": "a", "inputs": [], "out_bytes": 4, "fwd_flops": 7, "fwd_cost": value}]})


# ------------------------------------------------------------ measured op classes
def _stand_in_clock(monkeypatch, seconds):
    """Every timed call of a trace takes ``seconds`` (a stand-in clock); the clock's ticks, to count readings."""
    import scheduler.tracing.costs as costs_mod
    from scheduler.tracing import opclasses

    ticks = iter(range(10**6))
    real = opclasses.time_calls
    monkeypatch.setattr(costs_mod, "time_calls", lambda *a, **k: real(*a, **k, clock=lambda: seconds * next(ticks)))
    return ticks


def test_a_cpu_trace_prices_its_convolutions_at_their_timed_shapes(fake_cpu, monkeypatch, tmp_path):
    """NOTE [ Measured op classes ]: a class the roofline misprices is timed at the traced shapes (a stand-in
    clock here: each call takes 2 ms) and its node priced at that time; other nodes keep the roofline."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    x = torch.randn(2, 3, 16, 16)
    plain = capture(model, (x,)).graph  # fake_cpu pins no class: the roofline
    ticks = _stand_in_clock(monkeypatch, 2e-3)
    (tmp_path / "cache" / "op_classes.json").write_text('{"classes": ["convolution", "max_pool"], "recompute_scale": false}')
    timed = capture(model, (x,)).graph
    rate = timed.meta["costs"]["flops_per_s"]
    conv, relu, pool = ((nd.fwd_cost, p.fwd_cost) for nd, p in zip(timed.nodes, plain.nodes))  # one node a module
    assert conv[0] == round(2e-3 * rate) != conv[1] and pool[0] == round(2e-3 * rate) != pool[1]
    assert relu[0] == relu[1]  # not a timed class
    (tmp_path / "cache" / "op_classes.json").write_text('{"classes": ["max_pool"], "recompute_scale": false}')  # only the pooling
    again = [nd.fwd_cost for nd in capture(model, (x,)).graph.nodes]
    assert again[0] == conv[1] and again[2] == round(2e-3 * rate)
    before = next(ticks)
    assert capture(model, (x,), target="H100").graph.meta["costs"]["device"] == "H100"
    assert next(ticks) == before + 1  # a GPU's roofline times nothing here


def test_a_recomputed_kernel_is_priced_with_what_its_region_adds():
    """NOTE [ Plan overheads ]: ``recompute_op_s`` (the hooks and graph a recompute adds to each kernel) joins
    every kernel's roofline time in ``fwd_cost``; a view, which runs no kernel, stays free."""
    gm = torch.fx.symbolic_trace(_Ops())
    records, _ = measure_ops(gm, [torch.randn(64, 64), torch.randn(64, 64)])
    h100 = DEVICES["H100"]
    plain, _ = roofline_records(records, h100, "float32")
    surcharged, meta = roofline_records(records, h100, "float32", recompute_op_s=1e-5)
    assert meta["recompute_op_s"] == 1e-5
    for r, a, b in zip(records, plain, surcharged):
        assert b.fwd_cost == pytest.approx(a.fwd_cost + len(r.kernels) * 1e-5 * 67e12, rel=1e-9, abs=1)
    assert any(r.kernels for r in records) and any(not r.kernels for r in records)


@pytest.mark.parametrize("op, cls", [("aten.mm.default", "matmul"), ("aten.addmm.default", "matmul"),
                                     ("aten.bmm.default", "matmul"), ("aten.baddbmm.default", "matmul"),
                                     ("aten.convolution.default", "convolution"), ("aten.sum.dim_IntList", None),
                                     ("aten.mul.Tensor", None), ("aten._scaled_dot_product_flash_attention_for_cpu.default",
                                                                 None)])
def test_matrix_products_are_a_class_of_their_own(op, cls):
    from scheduler.tracing.roofline import op_class

    assert op_class(op) == cls


def test_a_cpu_trace_prices_its_matrix_products_at_their_timed_shapes(fake_cpu, monkeypatch, tmp_path):
    """NOTE [ Measured op classes ]: products run below the peak a large square one measures (a vocabulary head's
    at 75 GFLOP/s of 92-96 on this project's CPU; a small one from cold caches, as recomputed, at 67), so they are
    timed at their shapes (a stand-in clock: each call 3 ms) and their nodes priced so; the ReLU between them keeps
    the roofline."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32, bias=False))
    x = torch.randn(16, 32)
    plain = capture(model, (x,)).graph
    _stand_in_clock(monkeypatch, 3e-3)
    (tmp_path / "cache" / "op_classes.json").write_text('{"classes": ["matmul"], "chunk_loops": false, "recompute_scale": false}')
    timed = capture(model, (x,)).graph
    rate = timed.meta["costs"]["flops_per_s"]
    (a, a0), (r, r0), (b, b0) = ((nd.fwd_cost, p.fwd_cost) for nd, p in zip(timed.nodes, plain.nodes))
    assert a == round(3e-3 * rate) != a0 and b == round(3e-3 * rate) != b0  # addmm, mm
    assert r == r0


def test_each_timed_run_starts_after_a_cache_flush():
    """NOTE [ Measured op classes ]: the flush runs before every timed run (not the probe's warm-up), and writes
    its buffer each time; the buffer is made once."""
    from scheduler.tracing.opclasses import CacheFlush, time_calls
    from scheduler.tracing.workspaces import WorkspaceProbe

    probe = WorkspaceProbe()
    a, w = torch.randn(4, 8), torch.randn(8, 3)
    sig = probe.note(torch.ops.aten.mm.default, (a, w), {})
    events = []
    ticks = iter(range(10**6))

    def clock():
        events.append("clock")
        return 1e-3 * next(ticks)

    got = time_calls(probe, [sig, sig], ["matmul"], torch.device("cpu"), clock=clock, repeats=3,
                     flush=lambda: events.append("flush"))
    assert list(got) == [sig] and got[sig] == pytest.approx(1e-3)
    assert events == ["flush", "clock", "clock"] * 3
    flush = CacheFlush(nbytes=1024)
    flush()
    flush()
    assert flush._junk.numel() == 256 and torch.equal(flush._junk, torch.full((256,), 2.0))
    assert CacheFlush().nbytes >= 64 << 20


def test_timed_runs_hold_the_collector_off_and_default_to_cpu_time_on_one_thread(monkeypatch):
    """The collector runs before the timed runs and not during them (a collection walks the whole heap), and is
    as it was after, also when a run fails; one torch thread is timed by its CPU time, several by the wall clock."""
    import gc
    import time

    from scheduler.tracing.opclasses import no_collection, run_clock, time_calls
    from scheduler.tracing.workspaces import WorkspaceProbe

    probe = WorkspaceProbe()
    sig = probe.note(torch.ops.aten.mm.default, (torch.randn(4, 8), torch.randn(8, 3)), {})
    seen = []
    time_calls(probe, [sig], ["matmul"], torch.device("cpu"), clock=lambda: seen.append(gc.isenabled()) or 0.0,
               repeats=2, flush=lambda: None)
    assert seen == [False] * 4 and gc.isenabled()
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    with pytest.raises(RuntimeError):
        with no_collection():
            assert not gc.isenabled()
            raise RuntimeError("a run that fails")
    assert gc.isenabled() and collected == [1]
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert run_clock() is time.thread_time
        torch.set_num_threads(2)
        assert run_clock() is time.perf_counter
    finally:
        torch.set_num_threads(threads)
