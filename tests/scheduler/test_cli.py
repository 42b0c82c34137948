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
