"""``ckpt solve`` and ``ckpt fit`` with a layout: one plan per stage, each applying onto its stage's module."""

from __future__ import annotations

import pytest
import torch

import graphs
import scheduler
from scheduler.cli import main
from scheduler.distributed import Layout, solve_layout
from scheduler.models.staged import StagedLM, stage_module


def _model() -> StagedLM:
    torch.manual_seed(0)
    return StagedLM(vocab=64, width=16, heads=2, layers=4, seq=8).train()


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    x = torch.randint(0, 64, (2, 8))
    path = tmp_path_factory.mktemp("layout") / "lm.json"
    graphs.save(scheduler.trace(_model(), (x, x)), path)
    return path


def test_solve_writes_a_plan_per_stage_that_applies_onto_the_stage_module(graph_file, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["solve", str(graph_file), "--budget", "1GiB", "--pp", "2", "--microbatches", "4",
                 "--stages", "layers.2", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pp 2, 4 micro-batches, 1f1b" in text and "stage 0: 2 in flight" in text
    layout = Layout(pp=2, microbatches=4, stage_starts=("layers.2",))
    store = solve_layout(graphs.load(graph_file), "1GiB", layout).peak_bytes
    # a budget where the stage at the store-all peak must checkpoint
    assert main(["solve", str(graph_file), "--budget", f"{int(store * 0.95)}B", "--pp", "2", "--microbatches", "4",
                 "--stages", "layers.2", "-o", str(out)]) == 0
    capsys.readouterr()
    model = _model()
    regions = 0
    for k in range(2):
        plan = scheduler.load_plan(tmp_path / f"plan.stage{k}.json")
        assert graphs.load(tmp_path / f"plan.stage{k}.graph.json").fingerprint() == plan.fingerprint
        stage = stage_module(model, ["layers.2"], k)
        scheduler.apply(stage, plan)  # module paths and classes checked
        layers = {m.split(".")[1] for m in plan.modules if m.startswith("layers.")}
        assert layers <= ({"0", "1"} if k == 0 else {"2", "3"})
        regions += len(plan.regions)
    assert regions, "the tighter budget checkpoints something"


@pytest.mark.parametrize("flags, words", [
    (["--sp"], "needs tp > 1"),
    (["--pp", "4", "--microbatches", "2"], "at least as many micro-batches"),
    (["--pp", "2", "--microbatches", "2", "--solver", "all"], "one solver"),
    (["--pp", "2", "--microbatches", "2", "--stages", "layers.9"], "no submodule call"),
    (["--fsdp", "2", "--budget", "0.5"], "one rank's card"),
    # issue 33: accepted silently before
    (["--tp", "3"], "--tp 3 does not divide the model's 2 heads"),
    (["--fsdp-units", "layers.0"], "add --fsdp N"),
])
def test_a_bad_layout_is_one_line_and_exit_status_2(graph_file, capsys, flags, words):
    budget = [] if "--budget" in flags else ["--budget", "1GiB"]
    assert main(["solve", str(graph_file), *budget, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_fit_finds_the_largest_micro_batch_per_rank_and_the_smallest_card(capsys, tmp_path):
    out = tmp_path / "fit.json"
    assert main(["fit", "gpt", "--layers", "2", "--width", "64", "--heads", "2", "-O", "vocab=512", "--seq", "64",
                 "--device-memory", "16MiB", "--fsdp", "2", "--pp", "2", "--microbatches", "2", "--max-size", "4",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "largest micro-batch per rank on 16MiB: 4+" in text and "smallest card at batch 4:" in text
    assert (tmp_path / "fit.stage0.json").exists() and (tmp_path / "fit.stage1.graph.json").exists()


def test_a_stage_whose_solve_hit_its_time_limit_says_so(graph_file, monkeypatch):
    """Not "no plan": nothing was proven; the table names the limit to raise."""
    import solvers
    from scheduler.commands.layout import render_layout_plan
    from solvers.ilp import IlpTimeout

    def stopped(graph, budget_bytes, *, time_limit_s=60.0, **_):
        raise IlpTimeout(f"no plan found within {time_limit_s:g} s")

    def solve(graph, budget, *, solver="ilp", **options):
        return stopped(graph, budget, **options)

    monkeypatch.setattr(solvers, "get_solver", lambda name: stopped)
    monkeypatch.setattr(solvers, "solve", solve)
    layout = Layout(pp=2, microbatches=2)  # stage 0 holds 2 micro-batches (the in-flight search), stage 1 one
    plans = solve_layout(graphs.load(graph_file), "1GiB", layout, strict=False, time_limit_s=7)
    assert [s.stopped for s in plans.stages] == ["stopped at the time limit (no plan found in 7 s)"] * 2
    assert all(s.plan is None and s.no_plan_text == s.stopped for s in plans.stages)
    table = render_layout_plan(plans)
    assert table.count("stopped at the time limit (no plan found in 7 s)") == 2 and "  no plan" not in table
    with pytest.raises(solvers.InfeasibleBudget, match="was stopped at the time limit"):
        solve_layout(graphs.load(graph_file), "1GiB", layout, time_limit_s=7)


def test_the_trace_records_what_tensor_parallelism_splits(graph_file):
    """Issue 33: a --tp that divides neither the heads nor the widths was accepted; the trace now records them."""
    from scheduler.distributed.tensor_parallel import TP_META

    sizes = graphs.load(graph_file).meta[TP_META]
    assert 2 in sizes["heads"]
    assert solve_layout(graphs.load(graph_file), "1GiB", Layout(tp=2)).fits
