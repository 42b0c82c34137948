"""A chunked call's loop is timed at its own shape and prices the plans that run it (NOTE [ Chunk loops timed at
their shapes ] in scheduler.tracing.chunk_times). Every clock here is injected: no test reads the real one."""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest
import torch

import scheduler
from chunk_graphs import lm_graph
from graphs import COSTS_META, FUSED_HEADS_META
from solvers import Plan, simulate
from solvers.model.chunks import LOSS_SUFFIX, chunk_entries, find_tail
from solvers.model.overheads import CHUNK_TIMES_KEY, chunk_times, timed_extra, with_overheads

from scheduler.tracing import chunk_times as ct
from scheduler.tracing.tracer import capture

transformers = pytest.importorskip("transformers")

RATE = 1e9
ROWS_META = {"inputs": [{"shape": [2, 8], "dtype": "int64"}, {"shape": [2, 8], "dtype": "int64"}]}  # 16 token rows


def _graph(times=None, **figures):
    g = lm_graph(blocks=2)
    costs = {"flops_per_s": RATE, "peaks": {"bytes_per_s": 1e10}}
    if times is not None:
        costs[CHUNK_TIMES_KEY] = times
    g = dataclasses.replace(g, meta={**g.meta, **ROWS_META, COSTS_META: costs})
    return with_overheads(g, figures) if figures else g


def test_a_count_not_timed_is_read_off_the_line_through_its_neighbours():
    table = {2: 0.010, 4: 0.040}
    assert timed_extra(table, 1) == 0.0
    assert timed_extra(table, 2) == 0.010 and timed_extra(table, 4) == 0.040
    assert timed_extra(table, 3) == pytest.approx(0.025)  # between 2 and 4
    assert timed_extra(table, 8) == pytest.approx(0.100)  # beyond: the line through 2 and 4
    assert timed_extra({2: 0.010}, 4) == pytest.approx(0.030)  # one count timed: the line through 1 (0) and 2
    assert timed_extra({2: 0.030, 4: 0.010}, 16) == 0.0  # never below nothing


def test_a_timed_loop_prices_the_plan_in_place_of_the_formula_terms():
    figures = dict(chunk_s=3e-5, op_s=1e-6, gemm_rows=[(1, 1e9), (16, 4e9)], region_s=1e-5)
    g = _graph(**figures)
    head = find_tail(g).head + LOSS_SUFFIX
    timed = _graph({head: {"2": 0.011, "4": 0.052}}, **figures)
    for k, want in ((2, 0.011), (4, 0.052), (8, 0.052 + 2 * (0.052 - 0.011))):
        chunks = chunk_entries(g, k)
        plan = Plan(regions=((1, 3),), chunks=chunks)
        formula, measured = simulate(g, plan).overhead_s, simulate(timed, plan).overhead_s
        assert formula["chunk_loop"] > 0 and formula["chunk_gemm"] > 0 and formula["chunk_timed"] == 0
        assert measured["chunk_timed"] == pytest.approx(want)
        assert all(measured[t] == 0 for t in ("chunk_loop", "chunk_launches", "chunk_accumulation", "chunk_gemm"))
        assert measured["regions"] == formula["regions"] == pytest.approx(1e-5)  # the rest as before
    # a plan solved over a chunk menu says what the loop adds, and is chosen on it
    plan = scheduler.solve(timed, simulate(timed).peak_bytes, "ilp", chunks=(2,))
    assert [k for _, _, k in plan.chunks] == [2]
    assert plan.findings["extra_chunk_timed_s"] == pytest.approx(0.011)
    # without the overhead figures (the tests' pinned zero) the timed loop is still priced
    bare = _graph({head: {"2": 0.011}})
    assert simulate(bare, Plan(regions=(), chunks=chunk_entries(bare, 2))).overhead_s["chunk_timed"] == pytest.approx(0.011)


def test_a_malformed_table_is_not_read():
    g = _graph({"lm+loss": {"2": "fast"}, "zero": {"0": 0.5}, "nan": {"2": float("nan")}, "ok": {"4": 0.02},
                "fused": {"1": -0.003, "2": 0.01}})
    assert chunk_times(g) == {"ok": {4: 0.02}, "fused": {1: -0.003, 2: 0.01}}
    assert chunk_times(_graph("not a table")) == {}


def test_a_fused_head_timed_whole_prices_its_saving():
    table = {1: -0.004, 2: 0.006, 4: 0.030}
    assert timed_extra(table, 1) == -0.004  # the fused head whole saves time
    assert timed_extra(table, 3) == pytest.approx(0.018)
    assert timed_extra({1: -0.004, 2: -0.003}, 8) == pytest.approx(0.003)  # the line through 1 and 2
    assert timed_extra({1: -0.004, 2: -0.003, 4: -0.010}, 16) == pytest.approx(-0.010)  # never below the least
    def fused(g):
        return dataclasses.replace(g, meta={**g.meta, FUSED_HEADS_META: [find_tail(g).head]})

    g = fused(_graph())
    head = find_tail(g).head + LOSS_SUFFIX
    timed = fused(_graph({head: {"1": -0.004, "2": 0.006}}))
    whole = Plan(regions=(), chunks=((find_tail(g).first, len(g) - 1, 1),))
    assert simulate(timed, whole).overhead_s["chunk_timed"] == pytest.approx(-0.004)
    assert simulate(g, whole).overhead_s.get("chunk_timed", 0.0) == 0.0  # untimed: as the head as traced


def test_the_estimator_keeps_each_counts_least_time_over_alternating_rounds():
    now = [0.0]
    order = []
    cost = {1: 0.10, 2: 0.125, 4: 0.20}  # a pass of 0.425 s, under MAX_PASS_S
    noise = itertools.cycle([0.05, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.09])  # interference only adds

    def run(k):
        order.append(k)
        now[0] += cost[k] + next(noise)

    got = ct._seconds(run, (1, 2, 4), lambda: now[0], rounds=3, budget_s=1e9, faults=lambda: 0)
    assert got == pytest.approx({2: 0.025, 4: 0.10})
    assert order == [1, 2, 4] * 2 + [1, 2, 4, 4, 2, 1, 1, 2, 4]  # two warm-up passes, then ABC CBA ABC
    # rounds as the budget holds at the warm-up's pace, never below MIN_ROUNDS
    order.clear()
    ct._seconds(run, (1, 2, 4), lambda: now[0], rounds=9, budget_s=1.5, faults=lambda: 0)
    assert len(order) == 6 + ct.MIN_ROUNDS * 3


def test_a_call_too_slow_to_time_is_left_to_the_formula_and_a_loaded_machine_stops_the_rounds():
    now, order = [0.0], []

    def slow(k):  # a pass of 3.6 s by the run clock
        order.append(k)
        now[0] += 1.2

    assert 2 * ct.MAX_PASS_S < 3.6
    assert ct._seconds(slow, (1, 2, 4), lambda: now[0], rounds=9, faults=lambda: 0) is None
    assert order == [1, 2, 4]  # past twice MAX_PASS_S in the first pass: no second
    # the wall clock runs 10 s a run while the run clock reads 0.1: the rounds stop past three budgets (two run)
    cpu, wall, order[:] = [0.0], [0.0], []

    def loaded(k):
        order.append(k)
        cpu[0] += 0.1
        wall[0] += 10.0

    got = ct._seconds(loaded, (1, 2), lambda: cpu[0], rounds=9, budget_s=5.0, wall=lambda: wall[0], faults=lambda: 0)
    assert got == pytest.approx({2: 0.0})
    assert len(order) == 4 + 2 * 2


def test_runs_that_faulted_pages_in_count_only_where_every_run_of_their_count_did():
    now, pages, calls = [0.0], [0], []
    # timed runs (after 6 warm-up runs): the whole call's fastest run and one of 4 chunks fault 32 MB in again
    fast_but_faulted = {6: (1, 0.05), 9: (4, 0.15)}

    def run(k):
        calls.append(k)
        i = len(calls) - 1
        if i in fast_but_faulted:
            now[0] += fast_but_faulted[i][1]
            pages[0] += 8000
        else:
            now[0] += {1: 0.10, 2: 0.125, 4: 0.20}[k]

    got = ct._seconds(run, (1, 2, 4), lambda: now[0], rounds=3, budget_s=1e9, faults=lambda: pages[0])
    assert [calls[i] for i in fast_but_faulted] == [1, 4]
    assert got == pytest.approx({2: 0.025, 4: 0.10})  # the faulted runs are not the counts' least times
    # every run of a count faulted (no steady heap): those runs are all there is
    now[0], calls[:] = 0.0, []

    def always(k):
        pages[0] += 8000
        now[0] += {1: 0.10, 2: 0.125, 4: 0.20}[k]

    assert ct._seconds(always, (1, 2, 4), lambda: now[0], rounds=3, budget_s=1e9,
                       faults=lambda: pages[0]) == pytest.approx({2: 0.025, 4: 0.10})


def test_runs_are_timed_by_cpu_time_on_one_thread_and_budgets_by_the_wall_clock():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert ct.run_clock() is time.thread_time
        torch.set_num_threads(2)
        assert ct.run_clock() is time.perf_counter
    finally:
        torch.set_num_threads(threads)
    # the rounds follow the wall clock's warm-up pace, the figures the run clock
    cpu, wall = [0.0], [0.0]

    def run(k):
        cpu[0] += {1: 0.10, 2: 0.15}[k]
        wall[0] += 1.0  # another process holds the core: every run takes 1 s by the wall

    got = ct._seconds(run, (1, 2), lambda: cpu[0], rounds=9, budget_s=14.0, wall=lambda: wall[0], faults=lambda: 0)
    assert got == pytest.approx({2: 0.05})
    assert wall[0] == pytest.approx(1.0 * (4 + 2 * 7))  # 14 s hold 7 rounds of 2 s, as the wall clock reads


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=96, n_positions=16, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, 96, (2, 8))
    return model, {"input_ids": ids, "labels": ids}


def test_the_trace_times_the_head_and_loss_as_the_applier_runs_them(monkeypatch, tmp_path, fake_cpu):
    model, kwargs = _gpt2()
    loss = lambda out: out.loss  # noqa: E731
    traced = capture(model, (), kwargs, loss=loss)  # the tests' pinned files: nothing timed
    assert CHUNK_TIMES_KEY not in traced.graph.meta["costs"]
    # the loop itself, with a clock that moves by 1 ms per reading: every figure 0, but each count ran in chunks
    calls = []
    hook = model.lm_head.register_forward_hook(lambda m, a, o: calls.append(a[0].numel() // a[0].shape[-1]))
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    rng = torch.get_rng_state()
    ticks = itertools.count()
    got = ct.time_chunk_loops(model, traced.graph, traced.members, traced.gm, clock=lambda: 1e-3 * next(ticks),
                              counts=(2, 4), rounds=2)
    hook.remove()
    assert got == {"lm_head+loss": {"2": 0.0, "4": 0.0}}
    # 2 warm-up passes and 2 rounds: the head whole over 16 rows, in 2 chunks of 8, in 4 of 4
    assert sorted(calls) == sorted([16] * 4 + [8] * 8 + [4] * 16)
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in model.parameters())  # as they were
    assert torch.equal(torch.get_rng_state(), rng)
    # switched on in the calibration folder's file, a CPU trace stores what it timed and plans are priced on it
    monkeypatch.setattr(ct, "time_chunk_loops", lambda *a, **k: {"lm_head+loss": {"2": 0.004, "4": 0.019}})
    (tmp_path / "cache" / "op_classes.json").write_text('{"classes": [], "recompute_scale": false}', encoding="utf-8")  # fake_cpu's
    import scheduler.tracing.tracer as tracer_mod

    monkeypatch.setattr(tracer_mod, "time_chunk_loops", ct.time_chunk_loops)
    g = capture(model, (), kwargs, loss=loss).graph
    assert chunk_times(g) == {"lm_head+loss": {2: 0.004, 4: 0.019}}
    assert capture(model, (), kwargs, loss=loss, target="H100").graph.meta["costs"].get(CHUNK_TIMES_KEY) is None
    plan = scheduler.solve(g, simulate(g).peak_bytes, "ilp", chunks=(4,))
    assert plan.chunks and plan.findings["extra_chunk_timed_s"] == pytest.approx(0.019)


def test_a_fused_head_is_timed_whole_against_the_head_as_traced(monkeypatch):
    model, kwargs = _gpt2()
    traced = capture(model, (), kwargs, loss=lambda out: out.loss)
    ran = []
    fused = ct.fused_head_loss

    def counted(head, x, labels, kind, k, *a, **kw):
        ran.append(k)
        return fused(head, x, labels, kind, k, *a, **kw)

    monkeypatch.setattr(ct, "fused_head_loss", counted)
    now = [0.0]

    def clock():  # the head as traced 3 ms a run, fused whole 2, in 2 chunks 5, in 4 chunks 9 (each reading 0)
        return now[0]

    def timed(k):  # run k's time, by the counts the runs see in turn (0: the head as traced)
        now[0] += {0: 3e-3, 1: 2e-3, 2: 5e-3, 4: 9e-3}[k]

    original = ct._seconds

    def seconds(run, counts, *a, **kw):
        assert counts == (0, 1, 2, 4)
        return original(lambda k: (run(k), timed(k)), counts, *a, **kw)

    monkeypatch.setattr(ct, "_seconds", seconds)
    got = ct.time_chunk_loops(model, traced.graph, traced.members, traced.gm, clock=clock, counts=(2, 4), rounds=2)
    assert got["lm_head+loss"] == pytest.approx({"1": -1e-3, "2": 2e-3, "4": 6e-3})
    assert sorted(set(ran)) == [1, 2, 4]  # the fused loops the plan runs, the whole one too


def test_the_switch_is_read_from_the_calibration_folder(tmp_path):
    assert ct.times_chunk_loops(tmp_path)  # no file: on
    (tmp_path / "op_classes.json").write_text('{"classes": ["convolution"], "chunk_loops": false}')
    assert not ct.times_chunk_loops(tmp_path)
    (tmp_path / "op_classes.json").write_text('{"classes": []}')
    assert ct.times_chunk_loops(tmp_path)


def test_a_call_like_one_timed_takes_its_figures_and_a_spent_budget_leaves_the_rest_to_the_formula():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=96, max_position_embeddings=16, use_cache=False)
    model = transformers.LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, 96, (2, 8))
    traced = capture(model, (), {"input_ids": ids, "labels": ids}, loss=lambda out: out.loss)
    ran = {0: 0, 1: 0}
    for i in ran:
        model.model.layers[i].mlp.register_forward_hook(lambda m, a, o, i=i: ran.__setitem__(i, ran[i] + 1))
    now = [0.0]

    def clock():  # each reading 1 ms later, and a call's run as long as its chunks are many
        now[0] += 1e-3
        return now[0]

    got = ct.time_chunk_loops(model, traced.graph, traced.members, traced.gm, clock=clock, counts=(2,), rounds=2)
    assert set(got) == {"lm_head+loss", "model.layers.0.mlp", "model.layers.1.mlp"}
    assert got["model.layers.1.mlp"] == got["model.layers.0.mlp"]
    assert ran[0] > 0 and ran[1] == 0  # the second layer's MLP is the first's: not run again
    spent = ct.time_chunk_loops(model, traced.graph, traced.members, traced.gm, clock=clock, counts=(2,), rounds=2,
                                total_s=0.0)
    assert spent == {}  # nothing timed once the budget is spent: every call priced by its formula
