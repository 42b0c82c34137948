"""A trace measures what its blocks' recompute costs in the step and scales the recompute costs by it (NOTE [
Recompute timed in the step ] in scheduler.tracing.recompute_scale). Every clock here is injected."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import scheduler
import scheduler.applying  # noqa: F401  (registers how a plan runs for one step)
from solvers import simulate

from scheduler.tracing import recompute_scale as rs
from scheduler.tracing.tracer import capture

RUNS = [0]  # the blocks' forward calls so far: the tests' clock


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.norm = nn.Linear(16, 16), nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        RUNS[0] += 1
        return torch.tanh(self.norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return nn.functional.cross_entropy(self.head(x), y)


def _net():
    torch.manual_seed(0)
    return Net().train(), (torch.randn(8, 16), torch.randint(0, 4, (8,)))


def test_the_blocks_recompute_measured_in_the_step_scales_every_recompute_cost():
    model, args = _net()
    g = capture(model, args).graph  # the tests' pinned files: nothing timed
    assert rs.SCALE_KEY not in g.meta["costs"]
    plan = rs.block_plan(g)
    assert plan.modules == ("blocks.0", "blocks.1", "blocks.2")
    predicted = simulate(g, plan).recompute_time_s
    unit = 1.7 * predicted / 3  # a block's forward, by the clock: the planned step runs each twice
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    before = RUNS[0]
    scaled = rs.recompute_scale(model, g, args, {}, None, clock=lambda: RUNS[0] * unit, rounds=2)
    # 2 warm-up passes and 2 rounds, each the plain step (3 block calls) and the planned one (3, and 3 recomputed)
    assert RUNS[0] - before == 4 * (3 + 6)
    found = scaled.meta["costs"][rs.SCALE_KEY]
    assert found["scale"] == pytest.approx(1.7) and found["measured_s"] == pytest.approx(3 * unit)
    assert found["predicted_s"] == pytest.approx(predicted) and found["blocks"] == 3
    assert [nd.fwd_cost for nd in scaled.nodes] == [round(nd.fwd_cost * found["scale"]) for nd in g.nodes]
    assert simulate(scaled, plan).recompute_time_s == pytest.approx(1.7 * predicted, rel=1e-3)
    assert scaled.fingerprint() == g.fingerprint()  # the same model: its plans apply as before
    # the model as it was: gradients, BatchNorm statistics, the RNG
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in model.parameters())
    assert all(torch.equal(b, s) for b, s in zip(model.buffers(), buffers))
    assert torch.equal(torch.get_rng_state(), rng)


def _steps(plain_s, planned_s):
    now = [0.0]

    def run(s):
        def go():
            now[0] += s
        return go
    return (lambda: now[0]), run(plain_s), run(planned_s)


@pytest.mark.parametrize("extra, want", [(0.0, rs.MIN_SCALE), (1.0, rs.MAX_SCALE)])
def test_a_scale_beyond_its_bounds_is_kept_at_them(extra, want):
    model, args = _net()
    g = capture(model, args).graph
    plan = rs.block_plan(g)
    clock, plain, planned = _steps(0.010, 0.010 + extra)
    found = rs.measure_scale(g, plain, planned, plan, clock=clock, rounds=2)
    assert found["scale"] == want and found["measured_s"] == pytest.approx(extra)


def test_a_plain_step_slowed_in_most_rounds_moves_no_figure():
    """Interference only adds time: each side's least time over the rounds is its own, so a plain step slowed in
    three rounds of five (each difference of those rounds smaller) moves neither the scale nor a head's offset
    (the median of the rounds' differences had moved both: NOTE [ Recompute timed in the step ])."""
    from scheduler.tracing.chunk_times import with_chunk_times

    model, kwargs = _gpt2()
    g = with_chunk_times(capture(model, (), kwargs, loss=lambda out: out.loss).graph, {"lm_head+loss": {"2": 0.003}})
    plan = rs.block_plan(g)
    predicted = simulate(g, plan).recompute_time_s
    name, plans = rs.head_plans(g)
    sim = simulate(g, plans["2"])
    expected = sim.recompute_time_s + sum(sim.overhead_s.values())
    now, calls = [0.0], [0]

    def run(s):
        def go():
            now[0] += s
        return go

    def plain():  # two warm-up passes, then five rounds: slowed by 5 ms in the second to fourth
        calls[0] += 1
        now[0] += 0.010 + (0.005 if calls[0] in (4, 5, 6) else 0.0)

    heads = {"2": (run(0.010 + expected + 0.001), plans["2"])}
    found = rs.measure_scale(g, plain, run(0.010 + 1.5 * predicted), plan, heads=heads, clock=lambda: now[0],
                             rounds=5)
    assert calls[0] == 2 + 5
    assert found["measured_s"] == pytest.approx(1.5 * predicted) and found["scale"] == pytest.approx(1.5)
    assert found["head_offset_s@2"] == pytest.approx(0.001)


def test_region_overheads_are_taken_from_what_the_blocks_add():
    from solvers.model.overheads import with_overheads

    model, args = _net()
    g = with_overheads(capture(model, args).graph, {"region_s": 1e-4})
    plan = rs.block_plan(g)
    predicted = simulate(g, plan).recompute_time_s
    clock, plain, planned = _steps(0.010, 0.010 + 3e-4 + 1.5 * predicted)
    found = rs.measure_scale(g, plain, planned, plan, clock=clock, rounds=2)
    assert found["overheads_s"] == pytest.approx(3e-4) and found["scale"] == pytest.approx(1.5)


def test_no_blocks_a_planned_model_or_a_long_step_leave_the_roofline_as_it_is(monkeypatch):
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)).train()
    x = torch.randn(4, 8)
    g = capture(seq, (x,), loss=lambda out: out.sum()).graph
    assert rs.block_plan(g) is None
    assert rs.recompute_scale(seq, g, (x,), {}, lambda out: out.sum(), clock=lambda: 0.0) is g
    model, args = _net()
    g = capture(model, args).graph
    never = lambda: pytest.fail("no step is timed")  # noqa: E731
    scheduler.apply(model, rs.block_plan(g))
    assert rs.recompute_scale(model, g, args, {}, None, clock=never) is g
    scheduler.remove(model)
    monkeypatch.setattr(rs, "MAX_STEP_S", 0.0)
    assert rs.recompute_scale(model, g, args, {}, None, clock=never) is g
    monkeypatch.undo()
    monkeypatch.setattr(rs, "_APPLIER", None)  # the applier not loaded: nothing to run a plan with
    assert rs.recompute_scale(model, g, args, {}, None, clock=never) is g


def test_a_step_that_fails_leaves_the_roofline_and_the_model_as_they_were():
    model, args = _net()
    g = capture(model, args).graph
    buffers = [b.clone() for b in model.buffers()]
    bad = (args[0], torch.full((8,), 9))  # a label out of range: cross_entropy raises
    assert rs.recompute_scale(model, g, bad, {}, None, clock=lambda: 0.0) is g
    assert all(torch.equal(b, s) for b, s in zip(model.buffers(), buffers))


def test_a_cpu_trace_measures_it_where_the_calibration_folder_says(monkeypatch, tmp_path, fake_cpu):
    import scheduler.tracing.tracer as tracer_mod

    model, args = _net()
    seen = []

    def spy(model, graph, *a, **k):
        seen.append(graph.name)
        return rs.with_recompute_scale(graph, {"scale": 2.0, "measured_s": 0.0, "predicted_s": 0.0,
                                               "overheads_s": 0.0, "blocks": 3.0})

    monkeypatch.setattr(tracer_mod, "recompute_scale", spy)
    plain = capture(model, args).graph  # fake_cpu's file says no
    assert not seen and rs.SCALE_KEY not in plain.meta["costs"]
    (tmp_path / "cache" / "op_classes.json").write_text('{"classes": [], "chunk_loops": false}', encoding="utf-8")
    g = capture(model, args).graph
    assert len(seen) == 1 and g.meta["costs"][rs.SCALE_KEY]["scale"] == 2.0
    assert [nd.fwd_cost for nd in g.nodes] == [2 * nd.fwd_cost for nd in plain.nodes]
    capture(model, args, target="H100")  # a GPU's roofline: not this CPU's step
    assert len(seen) == 1


def test_what_keeping_a_node_per_block_adds_prices_the_selective_policy_per_call():
    from solvers.model.overheads import graph_overheads, overhead_seconds, with_overheads

    model, args = _net()
    g = with_overheads(capture(model, args).graph, {"selective_op_s": 1e-5, "kept_call_s": 2e-6})
    plan, kept_plan = rs.block_plan(g), rs.block_plan(g, kept=True)
    assert kept_plan.regions == plan.regions and len(kept_plan.saved) == 3  # one node of each block
    assert all(any(a <= k <= b for k in kept_plan.saved) for a, b in plan.regions)
    predicted = simulate(g, plan).recompute_time_s
    saved = predicted - simulate(g, kept_plan).recompute_time_s
    assert saved > 0
    # the calls the selective term prices: 2 * 1e-5 per call, and 2e-6 per kept node
    calls = (overhead_seconds(g, kept_plan.regions, kept_plan.saved)["selective"] - 3 * 2e-6) / 2e-5
    assert calls == pytest.approx(rs._selective_calls(g, kept_plan))
    added = 0.0005  # what the kept plan's step took beyond the blocks' plan's
    now = [0.0]

    def run(s):
        def go():
            now[0] += s
        return go

    found = rs.measure_scale(g, run(0.010), run(0.010 + 1.2 * predicted), plan, kept=run(0.010 + 1.2 * predicted + added),
                             kept_plan=kept_plan, clock=lambda: now[0], rounds=2)
    assert found["scale"] == pytest.approx(1.2)
    want = (added + 1.2 * saved - 3 * 2e-6) / (2 * calls)
    assert found["selective_op_s"] == pytest.approx(want) and found["kept_added_s"] == pytest.approx(added)
    scaled = rs.with_recompute_scale(g, found)
    assert graph_overheads(scaled).selective_op_s == pytest.approx(want)
    assert graph_overheads(scaled).kept_call_s == 2e-6  # the other figures as calibrated
    # a kept plan that runs faster than its recompute saved says the policy costs nothing, not less
    found = rs.measure_scale(g, run(0.010), run(0.010 + predicted), plan, kept=run(0.010), kept_plan=kept_plan,
                             clock=lambda: now[0], rounds=2)
    assert found["selective_op_s"] == 0.0
    found = rs.measure_scale(g, run(0.010), run(0.010 + predicted), plan, kept=run(1.0), kept_plan=kept_plan,
                             clock=lambda: now[0], rounds=2)
    assert found["selective_op_s"] == rs.MAX_SELECTIVE_S  # no more than that per call: noise or another effect


def test_a_kept_plan_that_does_not_run_leaves_the_calibrated_policy_figure(monkeypatch):
    import scheduler.applying as applying
    from solvers.model.overheads import graph_overheads, with_overheads

    model, args = _net()
    g = with_overheads(capture(model, args).graph, {"selective_op_s": 1e-5})
    real = applying.planned

    def refused(*a, **k):
        raise RuntimeError("this policy does not run here")

    monkeypatch.setattr(rs, "_APPLIER", (lambda m, plan: refused if plan.saved else real(m, plan), applying.applied_plan))
    unit = 1.5 * simulate(g, rs.block_plan(g)).recompute_time_s / 3
    scaled = rs.recompute_scale(model, g, args, {}, None, clock=lambda: RUNS[0] * unit, rounds=2)
    found = scaled.meta["costs"][rs.SCALE_KEY]
    assert found["scale"] == pytest.approx(1.5) and "selective_op_s" not in found
    assert graph_overheads(scaled).selective_op_s == 1e-5



def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=16, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, 128, (2, 16))
    return model, {"input_ids": ids, "labels": ids}


def test_each_count_of_the_heads_loop_is_measured_in_the_step_and_moves_its_own_figure():
    """Where the trace timed the head's chunk loop, the rounds time the step with the head in each timed count too;
    what each adds beyond its figure moves that count's figure only (within MAX_HEAD_OFFSET of the plain step), and
    a count not timed is read off the line through the corrected ones."""
    from scheduler.tracing.chunk_times import with_chunk_times
    from solvers.model.overheads import chunk_times, timed_extra

    model, kwargs = _gpt2()
    loss = lambda out: out.loss  # noqa: E731
    g0 = capture(model, (), kwargs, loss=loss).graph
    assert rs.head_plans(g0) is None  # no loop timed: nothing to measure
    g = with_chunk_times(g0, {"lm_head+loss": {"1": -0.001, "2": 0.003, "4": 0.010}})
    name, plans = rs.head_plans(g)
    assert name == "lm_head+loss" and sorted(plans) == ["1", "2", "4"]
    assert all(hp.chunks[0][2] == int(k) and not hp.regions for k, hp in plans.items())

    def expected(graph, hp):
        sim = simulate(graph, hp)
        return sim.recompute_time_s + sum(sim.overhead_s.values())

    assert expected(g, plans["4"]) - expected(g, plans["2"]) == pytest.approx(0.007)  # priced by its figures
    plan = rs.block_plan(g)
    predicted = simulate(g, plan).recompute_time_s
    now = [0.0]

    def run(s):
        def go():
            now[0] += s
        return go

    added = {"1": 0.0002, "2": -0.0003, "4": 0.0011}  # what each count adds in the step beyond its figure
    heads = {k: (run(0.010 + expected(g, hp) + added[k]), hp) for k, hp in plans.items()}
    found = rs.measure_scale(g, run(0.010), run(0.010 + predicted), plan, heads=heads, clock=lambda: now[0],
                             rounds=2)
    for k, hp in plans.items():
        assert found[f"head_offset_s@{k}"] == pytest.approx(added[k])
        assert found[f"head_expected_s@{k}"] == pytest.approx(expected(g, hp))
    scaled = rs.with_recompute_scale(g, found, name)
    table = chunk_times(scaled)[name]
    assert table == pytest.approx({1: -0.0008, 2: 0.0027, 4: 0.0111})
    for k, hp in plans.items():  # each count now priced as the step measured it
        assert expected(scaled, hp) == pytest.approx(expected(g, hp) + added[k])
    assert timed_extra(table, 8) == pytest.approx(0.0111 + 2 * (0.0111 - 0.0027))  # through 2 and 4 as corrected
    assert chunk_times(rs.with_recompute_scale(g, found))[name] == chunk_times(g)[name]  # no call named: as timed
    heads = {"4": (run(1.0), plans["4"])}  # a count alone, far off: noise or another effect
    found = rs.measure_scale(g, run(0.010), run(0.010 + predicted), plan, heads=heads, clock=lambda: now[0],
                             rounds=2)
    assert found["head_offset_s@4"] == pytest.approx(rs.MAX_HEAD_OFFSET * 0.010) and "head_offset_s@2" not in found
    assert chunk_times(rs.with_recompute_scale(g, found, name))[name][2] == 0.003  # not measured: as timed
    # through the trace's own measurement: a step per count runs, each computing the plain step's loss
    losses = []
    clock = iter(range(10**6))
    scaled = rs.recompute_scale(model, g, (), kwargs, lambda out: losses.append(out.loss.item()) or out.loss,
                                clock=lambda: 1e-3 * next(clock), rounds=2)
    found = scaled.meta["costs"][rs.SCALE_KEY]
    assert {k for k in found if k.startswith("head_offset_s@")} == {f"head_offset_s@{k}" for k in plans}
    assert len(losses) >= 4 * (2 + len(plans))  # two passes of warm-up and two rounds over 5 steps
    assert max(losses) - min(losses) < 1e-4  # every step, the chunked ones too, computes the same loss


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.tanh(self.fc(x))], 1)


class Dense(nn.Module):
    """DenseNet's naming: numbered children (``layer1``, ``layer2`` ...) and no indexed blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        for i in range(3):
            self.add_module(f"layer{i + 1}", Layer(16 * (i + 1)))
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i in range(3):
            x = getattr(self, f"layer{i + 1}")(x)
        return nn.functional.cross_entropy(self.head(x), y)


def test_a_model_with_numbered_blocks_and_no_indexed_ones_has_its_scale_measured_on_them():
    from solvers.baselines import NoModulePaths, block_spans

    torch.manual_seed(0)
    model, args = Dense().train(), (torch.randn(8, 8), torch.randint(0, 4, (8,)))
    g = capture(model, args).graph
    with pytest.raises(NoModulePaths):
        block_spans(g)
    plan = rs.block_plan(g)
    assert plan.modules == ("layer1", "layer2", "layer3")
    unit = 1e-3
    calls = [0]

    def clock():
        calls[0] += 1
        return calls[0] * unit

    scaled = rs.recompute_scale(model, g, args, {}, None, clock=clock, rounds=2)
    assert scaled.meta["costs"][rs.SCALE_KEY]["blocks"] == 3  # measured, where the roofline was kept before


N = rs.MIN_COVERED  # blocks enough to time one region around them


class Stacked(nn.Module):
    """Blocks inside an ``nn.Sequential``: one region over them (its span) recomputes what the blocks do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*(Block() for _ in range(N)))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.head(self.body(x)), y)


def _stacked(figures=None):
    from solvers.model.overheads import with_overheads

    torch.manual_seed(0)
    model, args = Stacked().train(), (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    g = with_overheads(capture(model, args).graph, figures or {"region_s": 1e-4, "selective_op_s": 1e-5,
                                                                 "kept_call_s": 2e-6})
    return model, args, g


def solvers_plan(g, regions):
    from solvers import Plan

    return Plan.from_regions(g, regions)


def _run(now, s):
    def go():
        now[0] += s
    return go


def test_a_regions_call_is_fitted_from_the_blocks_and_one_region_over_them():
    """The blocks' plan adds s P + N r, one region over them s P' + r: both are read back, and the measured call
    replaces the calibrated one in the graph's figures (NOTE [ Recompute timed in the step ])."""
    from solvers.model.overheads import graph_overheads

    model, args, g = _stacked()
    plan, whole = rs.block_plan(g), rs.cover_plan(g, rs.block_plan(g))
    assert plan.modules == tuple(f"body.{i}" for i in range(N)) and whole.modules == ("body",)
    p, pw = simulate(g, plan).recompute_time_s, simulate(g, whole).recompute_time_s
    assert pw >= p > 0
    now, r = [0.0], 2e-3
    found = rs.measure_scale(g, _run(now, 0.010), _run(now, 0.010 + 1.3 * p + N * r), plan,
                             whole=_run(now, 0.010 + 1.3 * pw + r), whole_plan=whole, clock=lambda: now[0], rounds=2)
    assert found["scale"] == pytest.approx(1.3) and found["region_s"] == pytest.approx(r)
    assert found["calibrated_region_s"] == 1e-4 and found["overheads_s"] == pytest.approx(N * r)
    scaled = rs.with_recompute_scale(g, found)
    assert graph_overheads(scaled).region_s == pytest.approx(r)
    assert graph_overheads(scaled).selective_op_s == 1e-5  # the other figures as calibrated
    # the scale alone, the calibrated call charged, would have put the calls on the FLOPs
    alone = rs.measure_scale(g, _run(now, 0.010), _run(now, 0.010 + 1.3 * p + N * r), plan, clock=lambda: now[0],
                             rounds=2)
    assert alone["scale"] == pytest.approx(min(rs.MAX_SCALE, 1.3 + N * (r - 1e-4) / p))
    assert "region_s" not in alone
    # fewer blocks than that: no region over them is timed
    fewer = solvers_plan(g, plan.regions[:N - 1])
    assert rs.cover_plan(g, fewer) is None


def test_a_region_over_the_blocks_slower_than_the_blocks_leaves_the_calibrated_call():
    """One region costing more than N (a negative call by the fit: noise or another effect) moves nothing but
    what is recorded: the scale is the blocks' alone, the call as calibrated."""
    model, args, g = _stacked()
    plan = rs.block_plan(g)
    whole = rs.cover_plan(g, plan)
    p = simulate(g, plan).recompute_time_s
    now = [0.0]
    found = rs.measure_scale(g, _run(now, 0.010), _run(now, 0.010 + 1.5 * p + N * 1e-4), plan,
                             whole=_run(now, 0.010 + N * (1.5 * p + 1e-4)), whole_plan=whole, clock=lambda: now[0], rounds=2)
    assert found["scale"] == pytest.approx(1.5) and "region_s" not in found
    assert found["whole_measured_s"] == pytest.approx(N * (1.5 * p + 1e-4))


def test_the_trace_times_the_region_over_the_blocks_in_the_step():
    """End to end on the model: the cover's step runs in every round, and the graph carries the call measured."""
    from solvers.model.overheads import graph_overheads

    model, args, g = _stacked({"region_s": 1e-4})
    unit = 1.4 * simulate(g, rs.block_plan(g)).recompute_time_s / N
    before = RUNS[0]
    scaled = rs.recompute_scale(model, g, args, {}, None, clock=lambda: RUNS[0] * unit, rounds=2)
    # 2 warm-up passes and 2 rounds: the plain step (N block calls), the blocks' plan (N + N), the cover's (N + N),
    # the blocks keeping a node each (N + N); the cover's and the kept step once more before them, to see they run
    assert RUNS[0] - before == 2 * N + 2 * N + 4 * 7 * N
    found = scaled.meta["costs"][rs.SCALE_KEY]
    assert found["whole_measured_s"] == pytest.approx(N * unit) and found["measured_s"] == pytest.approx(N * unit)
    # the clock charges block calls only, not a region's: the fit reads a call of 0 and the scale of the blocks
    assert found["region_s"] == pytest.approx(0.0, abs=1e-12) and found["scale"] == pytest.approx(1.4)
    assert graph_overheads(scaled).region_s == pytest.approx(0.0, abs=1e-12)
