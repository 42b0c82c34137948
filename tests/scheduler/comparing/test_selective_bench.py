"""The issue-15 head-to-head harness (scheduler.comparing.headtohead, benchmarks/selective.py) on tiny models.

Checks the logic only (what runs when, what is compared, what is reported); no clock is asserted on.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from scheduler.comparing import headtohead
from scheduler.comparing.headtohead import alternate, head_to_head
from scheduler.comparing.run import block_plan, trace_graph
from solvers import simulate
from scheduler.comparing.workloads import workload

TINY = dict(layers=2, width=32, heads=2, vocab=64, batch=2, seq=16)


def test_alternate_rotates_the_order_every_round():
    order = []
    ticks = itertools.count()
    steps = {n: (lambda n=n: order.append(n)) for n in ("plain", "peer", "ours")}
    times = alternate(steps, repeats=3, clock=lambda: float(next(ticks)))
    assert order == ["plain", "peer", "ours", "peer", "ours", "plain", "ours", "plain", "peer"]
    assert all(len(v) == 3 and all(t == 1.0 for t in v) for v in times.values())


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    wl = workload("gpt", options=TINY)
    blocks = [m for n, m in wl.model.named_modules() if n.startswith("blocks.") and n.count(".") == 1]
    seen = {"plain": [], "ours": []}
    real = headtohead.alternate

    def spy(steps, **kw):
        # every plain and ours step of the timed run must find per-block removed
        def wrap(name, fn):
            def run():
                if name in seen:
                    seen[name].append(any("forward" in vars(b) for b in blocks))
                return fn()
            return run
        return real({n: wrap(n, f) for n, f in steps.items()}, **kw)

    headtohead.alternate = spy
    try:
        h = head_to_head(wl, "per-block", repeats=2)
    finally:
        headtohead.alternate = real
    return wl, blocks, h, seen


def test_peer_is_removed_for_the_plain_step_and_our_plan(pair):
    wl, blocks, h, seen = pair
    assert h.reason is None, h.reason
    assert seen["plain"] and seen["ours"] and not any(seen["plain"] + seen["ours"])
    assert not any("forward" in vars(b) for b in blocks)  # nothing left installed


def test_ours_is_at_or_below_the_peers_measured_peak_with_equal_gradients(pair):
    _, _, h, _ = pair
    assert h.ours.peak_bytes <= h.peer.peak_bytes
    # solved first where the graph puts per-block's own plan (at or above its measured peak), then lower
    wl = pair[0]
    graph = trace_graph(wl, "roofline")
    per_block = simulate(graph, block_plan(graph, wl.model), record=False).peak_bytes
    assert h.ours.budget_bytes <= max(h.peer.peak_bytes, per_block) and h.ours.solves >= 1
    assert h.ours.grad_max_abs_diff == 0.0 and h.peer.grad_max_abs_diff == 0.0
    assert h.ratio is not None and h.ratio > 0


def test_both_cost_models_predict_both_sides(pair):
    _, _, h, _ = pair
    for side in (h.peer, h.ours):
        assert set(side.predicted_extra_s) == {"roofline", "flops"}
        assert all(v is not None and v >= 0 for v in side.predicted_extra_s.values())
    assert h.error("roofline") is not None and h.error("flops") is not None
    d = h.to_dict()
    assert d["ratio"] == h.ratio and d["ours"]["budget_bytes"] == h.ours.budget_bytes


def test_benchmark_writes_a_table_and_its_checks(monkeypatch, tmp_path):
    from benchmarks import run as suite, selective

    assert "selective" in suite.SUITES
    doc = selective.run(models={"gpt": TINY}, with_compile=False, repeats=2)
    text = selective.report(doc)
    assert "| gpt | per-block |" in text
    assert "roofline's prediction error" in text and "no slower than per-block" in text
    assert doc["models"][0]["pairs"][0]["errors"].keys() == {"roofline", "flops"}


def test_a_peer_below_our_least_predicted_peak_is_met_by_our_least_plan_measured(monkeypatch):
    """Where every solver finds the peer's peak below its least budget (dp's chains can: hf:gpt2's per-block
    peak 452.3 MiB, dp's least 458.3 predicted, which measured 440.3), our least plan is solved and measured rather
    than the row left out; where that plan measures above the peer, the row says so and no budget is tried twice."""
    import solvers as solvers_mod
    from solvers import InfeasibleBudget

    torch.manual_seed(0)
    wl = workload("gpt", options=TINY)
    real = solvers_mod.solve
    asked = []
    floor = {}

    def solve(graph, budget, **kw):
        if not floor:  # our least plan: the per-block plan's predicted peak, which the tiny model measures under
            floor["b"] = simulate(graph, block_plan(graph, wl.model), record=False).peak_bytes + 1
        asked.append(budget)
        if budget < floor["b"]:
            raise InfeasibleBudget(budget, floor["b"], solver=kw.get("solver", ""))
        return real(graph, budget, **kw)

    monkeypatch.setattr(solvers_mod, "solve", solve)
    h = head_to_head(wl, "per-block", repeats=1)
    assert floor["b"] in asked and asked.count(floor["b"]) == 1
    # a first plan solved above the floor that measures over the peer does not stand for our least plan
    asked.clear()
    floor["b"] = None
    solved_at = []

    def solve_high(graph, budget, **kw):
        if floor["b"] is None:
            floor["b"] = simulate(graph, block_plan(graph, wl.model), record=False).peak_bytes - 1
        asked.append(budget)
        if budget < floor["b"]:
            raise InfeasibleBudget(budget, floor["b"], solver=kw.get("solver", ""))
        solved_at.append(budget)
        return real(graph, 1 << 40 if budget != floor["b"] else budget, **kw)  # above the floor: store-all

    monkeypatch.setattr(solvers_mod, "solve", solve_high)
    high = head_to_head(wl, "per-block", repeats=1)
    assert solved_at[0] > floor["b"] and floor["b"] in solved_at  # the store-all plan measured over, then the least
    assert high.reason is None or "our least plan measured above it" in high.reason
    if h.reason is None:
        assert h.ours.peak_bytes <= h.peer.peak_bytes and "our least plan" in h.ours.note
        assert h.ours.grad_max_abs_diff == 0.0
    else:
        assert "our least plan measured above it" in h.reason
