"""The size search: exact against a linear scan, monotone, honest when nothing fits."""

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from graphs import synthetic
from scheduler.sizing.search import SizedModel, fit_graphs, search_largest
from scheduler.sizing.memory import NothingFits
from solvers import available_solvers, simulate
from solvers import solve as _SOLVE

MB = 1 << 20
GiB = 1 << 30
# The optimal chain DP once registered (issue 3); until then the best uniform plan.
PLANNER = "dp" if "dp" in available_solvers() else "uniform"


@given(threshold=st.integers(0, 70), lo=st.integers(1, 10), hi=st.integers(10, 64), m=st.integers(1, 5))
@settings(max_examples=200, deadline=None)
def test_search_equals_linear_scan(threshold, lo, hi, m):
    calls = []

    def fits(size, phase):
        calls.append(size)
        return size <= threshold

    sizes = [s for s in range(lo, hi + 1) if s % m == 0]
    if not sizes:
        with pytest.raises(Exception):
            search_largest(fits, lo, hi, multiple_of=m)
        return
    got, capped = search_largest(fits, lo, hi, multiple_of=m)
    probed = list(calls)
    want = max((s for s in sizes if s <= threshold), default=None)
    assert got == want
    assert capped == (want == sizes[-1])
    assert all(s % m == 0 and lo <= s <= hi for s in probed)
    # Logarithmic: gallop + bisection, never a scan.
    assert len(set(probed)) <= 2 * (len(sizes).bit_length() + 1)


def chain_model(params_bytes: int = 64 * MB) -> SizedModel:
    """A transformer-like synthetic graph whose activations scale with the batch."""

    def graph_at(batch: int):
        g = synthetic.transformer(40, act_bytes=batch * 2 * MB)
        return dataclasses.replace(g, param_bytes=params_bytes, meta={**g.meta, "batch": batch})

    return SizedModel(graph_at=graph_at, dimension="batch", params=params_bytes // 4, name="synthetic")


def test_fit_on_synthetic_matches_linear_scan_and_is_monotone():
    model = chain_model()
    card = 2 * GiB
    probes = []
    res = fit_graphs(model, card, optimizer="adam", reserve=0, solver_names=["store-all", PLANNER],
                     max_size=64, progress=probes.append)
    budget = res.report.solver_budget_bytes
    assert budget == card - 2 * 64 * MB  # Adam state (2 x fp32) is outside the simulated step
    sa, dp = res.result("store-all"), res.result(PLANNER)
    # Linear scan with the simulator: store-all fits exactly up to its answer.
    scan = [b for b in range(1, 65) if simulate(model.graph_at(b)).peak_bytes <= budget]
    assert sa.size == max(scan) and scan == list(range(1, sa.size + 1))
    # Checkpointing buys a strictly larger batch, at a recompute price, still under the budget.
    assert dp.size > sa.size and dp.peak_bytes <= budget and dp.recompute_ratio > 0
    assert simulate(model.graph_at(dp.size), dp.plan).peak_bytes == dp.peak_bytes
    assert simulate(model.graph_at(dp.size + 1), None).peak_bytes > budget
    # Monotone answers: a bigger card never gives a smaller batch.
    bigger = fit_graphs(model, 3 * GiB, optimizer="adam", reserve=0, solver_names=["store-all", PLANNER], max_size=64)
    assert bigger.result("store-all").size >= sa.size and bigger.result(PLANNER).size >= dp.size
    # Progress was reported for every size tried, and traces were shared between solvers.
    assert {(p.solver, p.size) for p in probes} >= {(p.solver, p.size) for p in sa.probes + dp.probes}
    assert res.traces < len(sa.probes) + len(dp.probes)
    # The report at the largest size: store-all does not fit there, dp does.
    rows = {p.solver: p for p in res.report.plans}
    assert res.report.size["batch"] == dp.size and rows[PLANNER].fits and not rows["store-all"].fits


def test_nothing_fits_when_persistent_state_exceeds_the_card():
    model = chain_model(params_bytes=1 * GiB)  # 256 Mi fp32 parameters: Adam needs 4 GiB of state
    with pytest.raises(NothingFits) as info:
        fit_graphs(model, 3 * GiB, optimizer="adam", solver_names=["store-all", PLANNER])
    msg = str(info.value)
    assert "persistent state alone" in msg and "4.15 GiB" in msg and "3.00 GiB" in msg
    assert "ZeRO" in msg and "cannot help" in msg
    assert info.value.report.activation_room_bytes < 0


def test_nothing_fits_at_the_smallest_size():
    model = chain_model(params_bytes=64 * MB)
    with pytest.raises(NothingFits) as info:
        fit_graphs(model, 300 * MB, optimizer="adam", reserve=0, solver_names=["store-all", PLANNER], max_size=8)
    assert "smallest batch" in str(info.value) and "smaller batch" in str(info.value)


def test_multiple_of_and_cap():
    model = chain_model()
    res = fit_graphs(model, 8 * GiB, optimizer="sgd", reserve=0, solver_names=["store-all"], max_size=12,
                     multiple_of=4)
    r = res.result("store-all")
    assert r.size == 12 and r.capped and all(p.size % 4 == 0 for p in r.probes)


# ------------------------------------------------------------- named hf shapes on the meta device

LLAMA2_7B = 32000 * 4096 * 2 + 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) + 4096  # by hand: 6,738,415,616


def test_llama_2_7b_on_meta_reports_the_exact_parameter_count(capsys):
    from scheduler.cli import main

    # fp32 + Adam: 16 bytes per parameter = 100.4 GiB > 80 GiB before any activation: no tracing needed.
    rc = main(["fit", "hf:llama-2-7b", "--device-memory", "80GiB", "--optimizer", "adam"])
    out = capsys.readouterr().out
    assert rc == 1
    assert LLAMA2_7B == 6_738_415_616
    assert f"parameters ({LLAMA2_7B:,} x fp32)" in out
    assert "nothing fits" in out and "ZeRO" in out and "cannot help" in out
    with pytest.raises(NothingFits) as info:
        import scheduler

        scheduler.fit("hf:llama-2-7b", "80GiB", optimizer="adam", dtype="bf16", mixed_precision=True, seq=4096)
    s = info.value.report.state
    assert (s.params, s.param_bytes, s.grad_bytes) == (LLAMA2_7B, 2 * LLAMA2_7B, 2 * LLAMA2_7B)
    assert (s.optimizer_bytes, s.master_bytes) == (8 * LLAMA2_7B, 4 * LLAMA2_7B)


def test_local_config_json_is_accepted(tmp_path):
    import json

    from scheduler.models.hf_configs import HF_CONFIGS, hf_config, hf_param_count

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                "num_key_value_heads": 4, "vocab_size": 100, "tie_word_embeddings": False}))
    assert hf_config(str(path)).hidden_size == 64
    assert hf_param_count(str(tmp_path)) == 100 * 64 * 2 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert hf_param_count("gpt2-xl") == HF_CONFIGS["gpt2-xl"].params == 1_557_611_200


# ------------------------------------------------------------- one solver's stop, the plan fit reports


def _stopping(monkeypatch, stopper: str, from_batch: int, error):  # type: ignore[no-untyped-def]
    """``stopper`` stops with ``error(graph, budget)`` at batches from ``from_batch`` on; the others run as they do."""
    from scheduler.sizing import search

    def solve(graph, budget_bytes, solver="dp", **options):  # type: ignore[no-untyped-def]
        if solver == stopper and graph.meta["batch"] >= from_batch:
            raise error(graph, budget_bytes)
        return _SOLVE(graph, budget_bytes, solver=solver, **options)

    monkeypatch.setattr(search.solvers, "solve", solve)


def test_one_solvers_stop_keeps_the_others(monkeypatch):
    """NOTE [ One solver's stop ]: ilp stops (its time limit, no plan) from batch 4 on; every other answer stands."""
    from solvers.ilp import IlpTimeout

    model = chain_model()
    kw = dict(optimizer="adam", reserve=0, max_size=64)
    alone = fit_graphs(model, 2 * GiB, solver_names=["store-all", PLANNER], **kw)
    why = "no plan found within 10 s for this graph (40 nodes; not proven)"
    _stopping(monkeypatch, "ilp", 4, lambda g, b: IlpTimeout(f"{why}; raise time_limit_s"))
    res = fit_graphs(model, 2 * GiB, solver_names=["store-all", "ilp", PLANNER], **kw)
    ilp = res.result("ilp")
    assert ilp.size == 3 and ilp.plan is not None and ilp.stop == f"stopped at 4: {why}"
    assert [p.stop for p in ilp.probes if not p.fits] == [ilp.stop]
    for name in ("store-all", PLANNER):
        assert (res.result(name).size, res.result(name).stop) == (alone.result(name).size, "")
    assert res.best().solver == PLANNER and res.best().size == alone.result(PLANNER).size > 4
    rows = {p.solver: p for p in res.report.plans}  # at the best size: ilp stopped there, it did not "not fit"
    assert rows["ilp"].stopped and not rows["store-all"].stopped


def test_an_unproven_infeasible_is_a_stop_and_a_proven_one_is_not(monkeypatch):
    from solvers import InfeasibleBudget

    model = chain_model()
    kw = dict(optimizer="adam", reserve=0, max_size=64, solver_names=["store-all", PLANNER])
    _stopping(monkeypatch, PLANNER, 8, lambda g, b: InfeasibleBudget(b, b + 10, proven=False, time_limit_s=1.0))
    assert fit_graphs(model, 2 * GiB, **kw).result(PLANNER).stop.startswith("no plan found at 8, and none proven")
    _stopping(monkeypatch, PLANNER, 8, lambda g, b: InfeasibleBudget(b, b + 10))
    r = fit_graphs(model, 2 * GiB, **kw).result(PLANNER)
    assert (r.size, r.stop) == (7, "")  # gallop 1, 2, 4, 8 (fails), bisect 6, 7


def test_the_reported_plan_is_the_largest_then_the_cheapest(monkeypatch):
    """NOTE [ The plan fit reports ]: equal sizes go to the least recompute, then to the first solver asked."""
    model = chain_model()
    res = fit_graphs(model, 2 * GiB, optimizer="adam", reserve=0, max_size=64,
                     solver_names=["store-all", "chen", PLANNER])
    sizes = {r.solver: r.size for r in res.results}
    top = max(sizes.values())
    tied = [r for r in res.results if r.size == top]
    want = min(tied, key=lambda r: (r.plan.recompute_cost or 0, res.results.index(r)))
    assert res.best() is want and res.best().plan is not None
