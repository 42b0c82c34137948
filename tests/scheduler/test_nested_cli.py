"""``ckpt solve --nested`` and the floor message's nesting lever (NOTE [ Nested regions ] in solvers.model.nested)."""

from __future__ import annotations

import dataclasses
import json
import random

import graphs
import solvers
from scheduler.cli import main
from solvers import pareto_frontier
from random_graphs import random_graph, random_spans


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _graph():
    """A chain with module spans where nesting goes below every one-level plan (tests/solvers/test_nested.py)."""
    for seed in (61, 64, 99):  # of seeds 0..159, these (issue 33's walk): nesting dp's least plan goes lower too
        g = random_graph(seed, chain=True)
        g = dataclasses.replace(g, spans=tuple(random_spans(len(g), random.Random(7000 + seed), laminar=True)))
        nested, flat = (pareto_frontier(g, selective=False, nested=True)[0][0],
                        pareto_frontier(g, selective=False)[0][0])
        if nested < flat:
            return g, nested, flat
    raise AssertionError("none of these chains nests below one level")


def test_solve_nested_reaches_below_one_level_and_the_floor_names_the_lever(tmp_path, capsys):
    g, nested, flat = _graph()
    graphs.save(g, tmp_path / "g.json")
    code, _, err = run(capsys, "solve", str(tmp_path / "g.json"), "--budget", f"{nested}B", "--solver", "dp")
    assert code == 2 and "least feasible budget is" in err
    assert "solve with --nested" in err  # what nesting would bring the least plan to
    code, out, err = run(capsys, "solve", str(tmp_path / "g.json"), "--budget", f"{nested}B", "--solver", "dp",
                         "--nested", "-o", str(tmp_path / "p.json"))
    assert code == 0, err
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["inner"] and plan["peak_bytes"] <= nested < flat
    assert "nested inside them" in out
    assert solvers.load_plan(tmp_path / "p.json").inner == tuple(tuple(r) for r in plan["inner"])
