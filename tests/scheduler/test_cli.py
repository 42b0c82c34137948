"""The command line: help, solve/simulate round trip, errors as sentences."""

import json
import subprocess
import sys

import graphs
import pytest
import scheduler
import solvers
from graphs import synthetic
from scheduler.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_lists_commands(capsys):
    code, out, _ = run(capsys)
    assert code == 1 and "solve" in out and "simulate" in out


def test_python_dash_m_entry_point():
    res = subprocess.run([sys.executable, "-m", "scheduler", "simulate", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "store-all" in res.stdout


def test_solve_then_simulate(tmp_path, capsys):
    g = synthetic.transformer(40)
    graphs.save(g, tmp_path / "g.json")
    code, out, _ = run(capsys, "solve", str(tmp_path / "g.json"), "--budget", "0.5", "--solver", "uniform",
                       "-o", str(tmp_path / "p.json"))
    assert code == 0 and "predicted peak" in out and "region" in out
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["solver"] == "uniform" and plan["regions"]
    code, out, _ = run(capsys, "simulate", str(tmp_path / "g.json"), str(tmp_path / "p.json"))
    assert code == 0 and "peak:" in out and "fits" in out and "activation_grads" in out


def test_infeasible_budget_is_a_sentence(tmp_path, capsys):
    graphs.save(synthetic.chain(8), tmp_path / "g.json")
    code, _, err = run(capsys, "solve", str(tmp_path / "g.json"), "--budget", "1KiB", "--solver", "store-all")
    assert code == 2 and "least feasible budget is" in err and "Traceback" not in err


def test_infeasible_budget_describes_the_plan_that_reaches_the_least_peak():
    """The sentence after "least feasible budget is X" describes a plan that
    peaks at X (the solver's lowest), not store-all's higher peak."""
    g = synthetic.chain(12)
    store_all = solvers.simulate(g).peak_bytes
    with pytest.raises(solvers.InfeasibleBudget) as info:
        scheduler.solve(g, budget=1024, solver="uniform")
    exc = info.value
    assert exc.min_feasible_bytes < store_all and exc.best_regions
    text = str(exc)
    assert f"The lowest-peak plan found peaks at {solvers.format_bytes(exc.min_feasible_bytes)}" in text
    assert solvers.format_bytes(store_all) not in text


def test_bad_graph_file_is_a_sentence(tmp_path, capsys):
    (tmp_path / "g.json").write_text('{"nodes": [{"name": "a"}]}')
    code, _, err = run(capsys, "simulate", str(tmp_path / "g.json"))
    assert code == 2 and "missing required field 'out_bytes'" in err


def test_plan_for_other_graph_refused(tmp_path, capsys):
    graphs.save(synthetic.chain(8), tmp_path / "a.json")
    graphs.save(synthetic.chain(9), tmp_path / "b.json")
    assert run(capsys, "solve", str(tmp_path / "a.json"), "--budget", "1GiB", "--solver", "store-all",
               "-o", str(tmp_path / "p.json"))[0] == 0
    code, _, err = run(capsys, "simulate", str(tmp_path / "b.json"), str(tmp_path / "p.json"))
    assert code == 2 and "solved for another graph" in err


TINYNET = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.out(torch.relu(self.fc(x)))


class Net(nn.Module):
    def __init__(self, width, layers):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


def build(batch: int = 1, width: int = 16, layers: int = 2, device: str = "cpu"):
    torch.manual_seed(0)
    return Net(width, layers).to(device), (torch.randn(batch, 32, width, device=device),), {}
"""


def test_fit_takes_model_options_keeps_answers_past_a_stop_and_writes_the_plan(tmp_path, capsys, monkeypatch):
    """ckpt fit: ilp among the default solvers and the plan it reports; --layers / -O as ckpt trace takes them;
    dp stopping from batch 8 on (NOTE [ One solver's stop ]) leaves every other answer and exit status 0; -o writes
    the reported plan, which ckpt apply applies by the module paths it names."""
    from solvers import SolverInputError

    (tmp_path / "tinynet.py").write_text(TINYNET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)

    def solve(graph, budget_bytes, solver="dp", **options):  # type: ignore[no-untyped-def]
        if solver == "dp" and graph.meta["build"]["options"]["batch"] >= 8:
            raise SolverInputError("dp gave up here")
        return real(graph, budget_bytes, solver=solver, **options)

    real = solvers.solve
    monkeypatch.setattr(solvers, "solve", solve)
    code, out, err = run(capsys, "fit", "tinynet:build", "-m", "640KiB", "--reserve", "0", "--optimizer", "sgd",
                         "--layers", "3", "-O", "width=32", "--search", "none", "--batch", "8", "--target", "cpu",
                         "-o", "plan.json")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in
            (["store-all"], ["ilp"], ["dp"], ["chen"], ["per-module"])}
    assert [rows[s][1] for s in ("store-all", "ilp", "dp", "chen", "per-module")] == ["no", "yes", "no", "yes", "yes"]
    assert " ".join(rows["dp"]).endswith("stopped at 8: dp gave up here")
    assert ("plan: ilp at batch 8 (optimal over regions and kept nodes), checkpoints 2 submodule calls: "
            "blocks.{0-1}") in out  # NOTE [ One plan space ]: the status says over which set
    plan = solvers.load_plan(tmp_path / "plan.json")
    assert plan.solver == "ilp" and plan.modules == ("blocks.0", "blocks.1")
    assert plan.graph_meta["build"] == {"model": "tinynet:build", "options": {"layers": 3, "width": 32, "batch": 8}}
    code, out, err = run(capsys, "apply", "plan.json")
    assert code == 0, err
    assert "applied 2 checkpoint regions of the ilp plan to tinynet:build" in out and "blocks.1" in out


def test_fit_says_what_it_assumes_one_figure_one_name_and_apply_refuses_another_target(tmp_path, capsys,
                                                                                         monkeypatch):
    """Issue 33: fit on a CPU model silently assumed Adam and an H100; its stderr said "peak" and its table "step
    total" for one run; ``ckpt apply`` put the H100 plan on the CPU model without a word."""
    (tmp_path / "tinynet.py").write_text(TINYNET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "fit", "tinynet:build", "-m", "2MiB", "--reserve", "0", "--layers", "3",
                         "-O", "width=32", "--search", "none", "--batch", "8", "--solver", "ilp", "-o", "plan.json")
    assert code == 0, err
    assert "assuming: optimizer adam's state counted (the default; --optimizer" in out
    assert "planned for cuda = " in out and "--target cpu" in out
    progress = [line for line in err.splitlines() if "ilp at 8: fits" in line]
    assert progress and "step total on card" in progress[0] and " peak " not in progress[0]
    shown = progress[0].split("step total on card ")[1].split(",")[0].strip()
    row = next(line for line in out.splitlines() if line.split()[:1] == ["ilp"])
    assert shown in row  # the table's "step total on card", the same figure
    code, out, err = run(capsys, "apply", "plan.json")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "was solved for" in lines[0] and "--target cpu" in lines[0]
    code, out, err = run(capsys, "fit", "tinynet:build", "-m", "2MiB", "--reserve", "0", "--layers", "3",
                         "-O", "width=32", "--search", "none", "--batch", "8", "--solver", "ilp", "--optimizer", "adam",
                         "--target", "cpu", "-o", "plan.json")
    assert code == 0 and "(the default" not in out and "planned for --target cpu" in out
    assert run(capsys, "apply", "plan.json")[0] == 0


def test_solve_and_simulate_print_the_module_paths(tmp_path, capsys, monkeypatch):
    (tmp_path / "tinynet.py").write_text(TINYNET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "trace", "tinynet:build", "--batch", "8", "--layers", "4", "-o", "g.json")[0] == 0
    code, out, err = run(capsys, "solve", "g.json", "-b", "0.7", "-o", "p.json")
    assert code == 0, err
    plan = solvers.load_plan(tmp_path / "p.json")
    assert plan.modules and all(m.startswith("blocks.") for m in plan.modules)
    kept = f", keeping {len(plan.saved)} op outputs inside them" if plan.saved else ""  # ilp keeps nodes by default
    for line in (f"checkpoints {len(plan.modules)} submodule calls{kept}: ", *plan.modules):
        assert line in out
    code, out, _ = run(capsys, "simulate", "g.json", "p.json")
    assert code == 0 and f"checkpoints {len(plan.modules)} submodule calls{kept}: blocks." in out
    assert all(m in out for m in plan.modules)


def test_solve_takes_the_budget_terms_fit_takes(tmp_path, capsys):
    """ckpt solve --optimizer / --mixed-precision / --reserve: the budget is for the whole step, the persistent
    state outside the graph subtracted as ckpt fit subtracts it from a card (scheduler.sizing.memory)."""
    from scheduler.sizing.memory import memory_report, persistent_state

    g = synthetic.transformer(30)
    g = g.with_nodes(g.nodes, param_bytes=1 << 20, meta={**g.meta, "parameters": 1 << 19, "dtype": "bfloat16"})
    graphs.save(g, tmp_path / "g.json")
    card = solvers.simulate(g).peak_bytes + (8 << 20)
    code, out, err = run(capsys, "solve", str(tmp_path / "g.json"), "-b", f"{card}B", "--optimizer", "adamw",
                         "--mixed-precision", "--reserve", "5%", "-o", str(tmp_path / "p.json"))
    assert code == 0, err
    state = persistent_state(1 << 19, dtype="bf16", optimizer="adamw", mixed_precision=True)
    want = memory_report(state, card, reserve="5%").solver_budget_bytes
    assert want == card - card // 20 - (1 << 19) * (8 + 4)  # reserve, fp32 Adam state and fp32 master copy
    assert solvers.load_plan(tmp_path / "p.json").budget_bytes == want
    assert f"solvers plan against {solvers.format_bytes(want)}" in out


def test_trace_records_the_loop_and_apply_verify_runs_it(tmp_path, capsys):
    # NOTE [ The user's loop ]: --loop on the commands that trace; the plan carries it to --verify
    g = tmp_path / "g.json"
    code, out, _ = run(capsys, "trace", "gpt", "--layers", "1", "--width", "32", "--heads", "2", "--seq", "16",
                       "-O", "vocab=64", "--loop", "dropped", "-o", str(g))
    assert code == 0 and "loop dropped" in out
    data = json.loads(g.read_text())
    assert data["loop"] == "dropped" and data["outputs"]
    code, _, _ = run(capsys, "solve", str(g), "--budget", "1", "--solver", "store-all", "-o", str(tmp_path / "p.json"))
    assert code == 0 and json.loads((tmp_path / "p.json").read_text())["loop"] == "dropped"
    code, out, _ = run(capsys, "apply", str(tmp_path / "p.json"), "--verify", "--steps", "1", "--loop", "held")
    assert code == 0 and "loop (model output through backward)" in out and "held" in out


def test_the_status_says_over_which_set_it_is_optimal():
    # NOTE [ One plan space ] (solvers.ilp): solve, fit and compare print the set a plan is proven optimal over.
    from scheduler.report import status_text

    def plan(status, **findings):  # type: ignore[no-untyped-def]
        return solvers.Plan(regions=((0, 1),), status=status, findings=findings)

    assert status_text(plan("optimal", optimal_over="regions and kept nodes")) == \
        "optimal over regions and kept nodes"
    assert status_text(plan("feasible", optimal_over="regions only", selective="not searched: work limit")) == \
        "feasible (optimal over regions only; kept nodes not searched: work limit)"
    assert status_text(plan("feasible")) == "feasible"
