"""Bad inputs, hostile and careless, through the CLI and the API (issue 18).

Every CLI case asserts: its exit status, exactly one line on stderr, no
traceback, and that the output file that existed before is byte-identical
(NOTE [ How the CLI fails ] in ``scheduler.cli``, NOTE [ Output files ] in
``graphs.files``). Every API case asserts the error class and a one-line
message. Then the things a table cannot hold: a real SIGINT sent to a running
CP-SAT search, a closed stdout, numba without a writable cache.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import graphs
import scheduler
import solvers
from graphs import CkptError, GraphError, synthetic
from scheduler.sizing.budget import BudgetError
from scheduler.sizing.memory import parse_budget
from scheduler.cli import main
from solvers import InfeasibleBudget, Plan, PlanError, PlanMismatch, UnknownOption

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = b'{"an": "existing output file"}\n'


def _graph_dict() -> dict:
    return synthetic.transformer(20).to_dict()


def _bad_graph(change) -> bytes:  # type: ignore[no-untyped-def]
    d = _graph_dict()
    change(d)
    return json.dumps(d).encode()


def _set(key, value):  # type: ignore[no-untyped-def]
    return lambda d: d.__setitem__(key, value)


def _set_node(key, value):  # type: ignore[no-untyped-def]
    return lambda d: d["nodes"][3].__setitem__(key, value)


#: Files written into the case's folder: name -> bytes (``g.json``, ``plan.json`` and ``out.json`` always exist).
FILES = {
    "latin1.json": "{\"nodes\": [], \"name\": \"caf\xe9\"}".encode("latin-1"),
    "notjson.json": b"{nodes: [}",
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "nan.json": _bad_graph(_set_node("out_bytes", 123456789)).replace(b"123456789", b"NaN"),
    "inf.json": _bad_graph(_set_node("out_bytes", 123456789)).replace(b"123456789", b"Infinity"),
    "huge.json": _bad_graph(_set_node("out_bytes", 1e30)),
    "typo.json": _bad_graph(_set("param_byte", 2**30)),
    "nodetypo.json": _bad_graph(_set_node("saved_byte", 10)),
    "neg.json": _bad_graph(_set_node("out_bytes", -4)),
    "frac.json": _bad_graph(_set_node("fwd_flops", 2.5)),
    "boolsize.json": _bad_graph(_set_node("out_bytes", True)),
    "cycle.json": _bad_graph(lambda d: d["nodes"][0]["inputs"].append(d["nodes"][5]["name"])),
    "empty.json": b'{"nodes": []}',
    "dangling.json": _bad_graph(lambda d: d["nodes"][2]["inputs"].append("nobody")),
    "twice.json": _bad_graph(lambda d: d["nodes"].append(dict(d["nodes"][1]))),
    "format2.json": _bad_graph(_set("format", 2)),
    "list.json": b"[1, 2, 3]",
    "name.json": _bad_graph(_set("name", 42)),
    "sum.json": _bad_graph(lambda d: [n.__setitem__("out_bytes", 2**61) for n in d["nodes"][:4]]),
    "params.json": _bad_graph(_set("param_bytes", 2**30)),
}

#: (id, argv, exit status, text on stderr). In argv: {d} is the case's folder; {d}/out.json holds SENTINEL.
CLI_CASES = [
    # outputs
    ("solve -o the input", ["solve", "{d}/g.json", "-b", "0.5", "-o", "{d}/g.json"], 2, "also an input"),
    ("solve -o missing folder", ["solve", "{d}/g.json", "-b", "0.5", "-o", "{d}/no/such/p.json"], 2, "does not exist"),
    ("solve -o a directory", ["solve", "{d}/g.json", "-b", "0.5", "-o", "{d}"], 2, "is a directory"),
    ("solve -o /dev/full", ["solve", "{d}/g.json", "-b", "0.5", "-o", "/dev/full"], 2, "not a regular file"),
    ("solve -o empty", ["solve", "{d}/g.json", "-b", "0.5", "-o", ""], 2, "empty"),
    ("trace -o missing folder", ["trace", "gpt", "-o", "{d}/nowhere/g.json"], 2, "does not exist"),
    ("compare --json missing folder", ["compare", "gpt", "--quick", "--json", "{d}/x/r.json"], 2, "does not exist"),
    # budgets
    ("budget 1.5", ["solve", "{d}/g.json", "-b", "1.5", "-o", "{d}/out.json"], 2, "did you mean 1.5GiB or a fraction"),
    ("budget 512", ["solve", "{d}/g.json", "-b", "512", "-o", "{d}/out.json"], 2, "did you mean 512GiB"),
    ("budget 2", ["solve", "{d}/g.json", "-b", "2", "-o", "{d}/out.json"], 2, "did you mean"),
    ("budget 1e400", ["solve", "{d}/g.json", "-b", "1e400", "-o", "{d}/out.json"], 2, "not a finite number"),
    ("budget 1e400GiB", ["solve", "{d}/g.json", "-b", "1e400GiB"], 2, "2**62"),
    ("budget 0", ["solve", "{d}/g.json", "-b", "0", "-o", "{d}/out.json"], 2, "(0, 1]"),
    ("budget -1GiB", ["solve", "{d}/g.json", "-b=-1GiB"], 2, "cannot read"),
    ("budget 6G", ["solve", "{d}/g.json", "-b", "6G"], 2, "write GiB"),
    ("budget lots", ["solve", "{d}/g.json", "-b", "lots"], 2, "cannot read"),
    ("budget nan", ["solve", "{d}/g.json", "-b", "nan"], 2, "cannot read"),
    ("optimizer lion", ["solve", "{d}/g.json", "-b", "0.5", "--optimizer", "lion"], 2, "unknown optimizer"),
    ("optimizer with a fraction", ["solve", "{d}/g.json", "-b", "0.5", "--optimizer", "adam", "-o", "{d}/out.json"], 2,
     "a fractional budget (0.5) is a share of the store-all activations; an optimizer belongs to"),
    ("state over the budget", ["solve", "{d}/params.json", "-b", "3GiB", "--optimizer", "adam", "-o", "{d}/out.json"], 2,
     "persistent state alone (4.00 GiB = weights 1.00 GiB + gradients 1.00 GiB + optimizer state 2.00 GiB"),
    ("reserve bogus", ["solve", "{d}/g.json", "-b", "6GiB", "--reserve", "lots"], 2, "cannot read reserve"),
    ("mixed precision on fp32", ["solve", "{d}/g.json", "-b", "6GiB", "--mixed-precision"], 2, "bf16/fp16 weights"),
    # solver flags
    ("chen --time-limit", ["solve", "{d}/g.json", "-b", "0.5", "-s", "chen", "--time-limit", "3", "-o", "{d}/out.json"],
     2, "--time-limit does not apply to solver chen"),
    ("dp --gap", ["solve", "{d}/g.json", "-b", "0.5", "-s", "dp", "--gap", "0.1"], 2, "--gap does not apply"),
    ("uniform --method", ["solve", "{d}/g.json", "-b", "0.5", "-s", "uniform", "--method", "cp-sat"], 2, "--method"),
    ("--time-limit -3", ["solve", "{d}/g.json", "-b", "0.5", "--time-limit", "-3"], 2, "greater than 0"),
    ("--time-limit nan", ["solve", "{d}/g.json", "-b", "0.5", "--time-limit", "nan"], 2, "not a finite number"),
    ("--time-limit abc", ["solve", "{d}/g.json", "-b", "0.5", "--time-limit", "abc"], 2, "not a number"),
    ("--gap 1.5", ["solve", "{d}/g.json", "-b", "0.5", "--gap", "1.5"], 2, "[0, 1)"),
    ("--gap -0.1", ["solve", "{d}/g.json", "-b", "0.5", "--gap", "-0.1"], 2, "[0, 1)"),
    ("unknown solver", ["solve", "{d}/g.json", "-b", "0.5", "-s", "nope", "-o", "{d}/out.json"], 2, "unknown solver"),
    ("unknown method", ["solve", "{d}/g.json", "-b", "0.5", "--method", "magic"], 2, "invalid choice"),
    ("missing --budget", ["solve", "{d}/g.json"], 2, "required"),
    # graph files
    ("graph missing", ["solve", "{d}/none.json", "-b", "0.5", "-o", "{d}/out.json"], 2, "does not exist"),
    ("graph is a directory", ["simulate", "{d}"], 2, "is a directory"),
    ("graph not UTF-8", ["simulate", "{d}/latin1.json"], 2, "not UTF-8"),
    ("graph not JSON", ["simulate", "{d}/notjson.json"], 2, "not valid JSON"),
    ("graph nested deep", ["simulate", "{d}/deep.json"], 2, "too deep"),
    ("graph NaN", ["solve", "{d}/nan.json", "-b", "0.5", "-o", "{d}/out.json"], 2, "NaN is not a number JSON allows"),
    ("graph Infinity", ["simulate", "{d}/inf.json"], 2, "Infinity"),
    ("graph 1e30", ["solve", "{d}/huge.json", "-b", "0.5", "-s", "dp"], 2, "not below 2**62"),
    ("graph key typo", ["simulate", "{d}/typo.json"], 2, "did you mean 'param_bytes'"),
    ("node key typo", ["simulate", "{d}/nodetypo.json"], 2, "did you mean 'saved_bytes'"),
    ("negative size", ["simulate", "{d}/neg.json"], 2, "negative"),
    ("fractional FLOPs", ["simulate", "{d}/frac.json"], 2, "finite integer"),
    ("boolean size", ["simulate", "{d}/boolsize.json"], 2, "must be an integer"),
    ("cycle", ["simulate", "{d}/cycle.json"], 2, "cycle"),
    ("no nodes", ["simulate", "{d}/empty.json"], 2, "no nodes"),
    ("dangling input", ["simulate", "{d}/dangling.json"], 2, "is not a node of the graph"),
    ("duplicate node", ["simulate", "{d}/twice.json"], 2, "appears twice"),
    ("format 2", ["simulate", "{d}/format2.json"], 2, "format version"),
    ("graph is a list", ["simulate", "{d}/list.json"], 2, "JSON object"),
    ("graph name a number", ["simulate", "{d}/name.json"], 2, "must be a string"),
    ("sizes add past 2**62", ["simulate", "{d}/sum.json"], 2, "add up to"),
    # plans
    ("plan for another graph", ["simulate", "{d}/other.json", "{d}/plan.json"], 2, "solved for another graph"),
    ("plan without fingerprint", ["simulate", "{d}/g.json", "{d}/nofp.json"], 2, "no fingerprint"),
    ("plan key typo", ["simulate", "{d}/g.json", "{d}/ptypo.json"], 2, "did you mean 'regions'"),
    ("plan NaN bound", ["simulate", "{d}/g.json", "{d}/pnan.json"], 2, "NaN"),
    ("plan negative region", ["simulate", "{d}/g.json", "{d}/pneg.json"], 2, "negative"),
    ("plan region past the end", ["simulate", "{d}/g.json", "{d}/ppast.json"], 2, "past the last node"),
    ("plan regions overlap", ["simulate", "{d}/g.json", "{d}/poverlap.json"], 2, "overlap"),
    ("plan status bogus", ["simulate", "{d}/g.json", "{d}/pstatus.json"], 2, "status"),
    ("plan budget a string", ["simulate", "{d}/g.json", "{d}/pbudget.json"], 2, "must be an integer"),
    ("plan regions not a list", ["simulate", "{d}/g.json", "{d}/pregions.json"], 2, "[first, last] pairs"),
    ("plan names a module twice", ["simulate", "{d}/g.json", "{d}/pdup.json"], 2, "names module 'blocks.0' for 2 regions"),
    ("plan not UTF-8", ["simulate", "{d}/g.json", "{d}/latin1.json"], 2, "not UTF-8"),
    ("plan is a directory", ["simulate", "{d}/g.json", "{d}"], 2, "is a directory"),
    ("plan missing", ["apply", "gpt", "{d}/none.json"], 2, "does not exist"),
    ("unknown flag", ["simulate", "{d}/g.json", "--bogus"], 2, "unrecognized arguments"),
    ("unknown command", ["frobnicate"], 2, "invalid choice"),
    # models and their options
    ("--dtype int8", ["trace", "gpt", "--dtype", "int8", "-o", "{d}/out.json"], 2, "floating dtype"),
    ("--dtype nonsense", ["trace", "gpt", "--dtype", "float33"], 2, "unknown dtype"),
    ("--device cuda", ["trace", "gpt", "--device", "cuda:7"], 2, "CUDA"),
    ("--device nonsense", ["trace", "gpt", "--device", "toaster"], 2, "unknown device"),
    ("--width 64 --heads 5", ["trace", "gpt", "--width", "64", "--heads", "5"], 2, "not a multiple of heads"),
    ("--option width=abc", ["trace", "gpt", "--option", "width=abc"], 2, "takes an integer"),
    ("--option without =", ["trace", "gpt", "--option", "width"], 2, "KEY=VALUE"),
    ("--option unknown", ["trace", "gpt", "-O", "wingspan=3"], 2, "does not take option"),
    ("--batch 0", ["trace", "gpt", "--batch", "0"], 2, "positive integer"),
    ("--granularity bogus", ["trace", "gpt", "--granularity", "coarse"], 2, "module depth"),
    ("model :build", ["trace", ":build"], 2, "package.module:factory"),
    ("model nosuch:build", ["trace", "nosuch_module_xyz:build"], 2, "cannot import"),
    ("model unknown", ["trace", "gpt5"], 2, "unknown model"),
    ("apply --steps 0", ["apply", "gpt", "{d}/plan.json", "--verify", "--steps", "0"], 2, "positive integer"),
    ("apply --atol -1", ["apply", "gpt", "{d}/plan.json", "--verify", "--atol", "-1"], 2, "0 or more"),
    ("compare --budgets 1.5", ["compare", "gpt", "--budgets", "1.5"], 2, "fractions in (0, 1]"),
    ("compare --solvers nope", ["compare", "gpt", "--solvers", "nope"], 2, "unknown solver"),
    ("demo --budget 1.5", ["demo", "--budget", "1.5"], 2, "did you mean"),
    ("demo --steps 0", ["demo", "--steps", "0"], 2, "positive integer"),
    ("fit bare memory", ["fit", "gpt", "--device-memory", "80"], 2, "did you mean 80GiB"),
    ("fit --batch 0", ["fit", "gpt", "--device-memory", "2GiB", "--batch", "0"], 2, "positive integer"),
    ("fit --device", ["fit", "gpt", "-m", "2GiB", "--device", "cpu", "-o", "{d}/out.json"], 2, "meta device"),
    ("fit --plan-solver not searched", ["fit", "gpt", "-m", "2GiB", "-s", "dp", "--plan-solver", "ilp"], 2,
     "not among the solvers searched"),
    ("fit unknown solver", ["fit", "gpt", "-m", "2GiB", "-s", "nope"], 2, "nope"),
    ("fit -O width=abc", ["fit", "gpt", "-m", "2GiB", "-O", "width=abc", "-o", "{d}/out.json"], 2, "takes an integer"),
    ("fit -O unknown", ["fit", "gpt", "-m", "2GiB", "-O", "wingspan=3"], 2, "does not take option"),
    ("fit -o a Python file", ["fit", "gpt", "-m", "2GiB", "-o", "{d}/plan.py"], 2, "names a Python file"),
    # factories (badfac.py and badsyntax.py in the case's folder, on sys.path)
    ("trace -o the factory's source", ["trace", "badfac:build", "-o", "{d}/badfac.py"], 2, "names a Python file"),
    ("trace -o a link to the factory", ["trace", "badfac:build", "-o", "{d}/factory-link.json"], 2,
     "is also an input of this command"),
    ("factory not callable", ["trace", "badfac:__name__"], 2, "badfac.__name__ is a str, not a function"),
    ("factory missing", ["trace", "badfac:nothere", "-o", "{d}/out.json"], 2, "has no attribute 'nothere'"),
    ("factory kwargs a list", ["trace", "badfac:listkw", "-o", "{d}/out.json"], 2, "returned kwargs as list"),
    ("factory args a tensor", ["trace", "badfac:bare", "-o", "{d}/out.json"], 2, "returned args as Tensor"),
    ("factory inputs do not fit (fx)", ["trace", "badfac:mismatch", "-o", "{d}/out.json"], 2,
     "the model does not run on its example inputs ((2, 8) float32)"),
    ("factory inputs do not fit (export)", ["trace", "badfac:mismatch_loss", "-o", "{d}/out.json"], 2,
     "the model does not run on its example inputs ((2, 8) float32)"),
    ("module syntax error", ["trace", "badsyntax:build", "-o", "{d}/out.json"], 2, "SyntaxError: invalid syntax"),
    ("module raises on import", ["trace", "badimport:build"], 2, "importing badimport raised ValueError: boom"),
]

#: Factories the CLI cases above import from the case's folder.
FACTORIES = {
    "badfac.py": """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x).relu().sum()


def build(batch: int = 2):
    return Net(), (torch.randn(batch, 16),), {}


def listkw(batch: int = 2):
    return Net(), (torch.randn(batch, 16),), [1, 2]


def bare(batch: int = 2):
    return Net(), torch.randn(batch, 16), {}


def mismatch(batch: int = 2):
    return Net(), (torch.randn(batch, 8),), {}


def mismatch_loss(batch: int = 2):
    return nn.Linear(16, 16), (torch.randn(batch, 8),), {}, lambda y: y.sum()
""",
    "badsyntax.py": "def build(:\n",
    "badimport.py": "raise ValueError('boom')\n",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    g = synthetic.transformer(20)
    graphs.save(g, d / "g.json")
    graphs.save(synthetic.transformer(21), d / "other.json")
    plan = scheduler.solve(g, 0.6, solver="dp")
    plan.save(d / "plan.json")
    good = plan.to_dict()
    variants = {
        "nofp.json": {**good, "fingerprint": ""},
        "ptypo.json": {**{k: v for k, v in good.items() if k != "regions"}, "regions": [], "region": [[0, 1]]},
        "pneg.json": {**good, "regions": [[-1, 2]]},
        "ppast.json": {**good, "regions": [[0, 500]], "modules": [], "stochastic": [], "node_names": []},
        "poverlap.json": {**good, "regions": [[0, 3], [2, 5]]},
        "pstatus.json": {**good, "status": "great"},
        "pbudget.json": {**good, "budget_bytes": "6GiB"},
        "pregions.json": {**good, "regions": "0-3"},
        "pdup.json": {**good, "regions": [[0, 2], [4, 6]], "modules": ["blocks.0", "blocks.0"]},
    }
    for name, data in variants.items():
        (d / name).write_text(json.dumps(data))
    (d / "pnan.json").write_text(json.dumps(good).replace('"bound": ' + json.dumps(good["bound"]), '"bound": NaN'))
    for name, data in FILES.items():
        (d / name).write_bytes(data)
    for name, text in FACTORIES.items():
        (d / name).write_text(text)
    os.symlink(d / "badfac.py", d / "factory-link.json")
    return d


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(case, folder, capsys, monkeypatch):
    _, argv, code, text = case
    monkeypatch.syspath_prepend(str(folder))
    (folder / "out.json").write_bytes(SENTINEL)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    got = main([a.format(d=folder) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert got == code, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert text in lines[0], lines[0]
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert after == before  # nothing written, nothing changed, no temporary file left behind


def _plan_for(g):  # type: ignore[no-untyped-def]
    return scheduler.solve(g, 1.0, solver="dp")


#: (id, call, error class, text in the message)
API_CASES = [
    ("simulate: plan of another graph", lambda: scheduler.simulate(synthetic.chain(9), _plan_for(synthetic.chain(8))),
     PlanMismatch, "solved for another graph"),
    ("simulate: plan without fingerprint", lambda: scheduler.simulate(synthetic.chain(8), Plan(regions=((1, 2),))),
     PlanMismatch, "check=False"),
    ("solve: bare 1.5", lambda: scheduler.solve(synthetic.chain(8), "1.5"), BudgetError, "did you mean"),
    ("solve: fraction 1.5", lambda: scheduler.solve(synthetic.chain(8), 1.5), BudgetError, "(0, 1]"),
    ("solve: NaN fraction", lambda: scheduler.solve(synthetic.chain(8), math.nan), BudgetError, "(0, 1]"),
    ("solve: option chen lacks", lambda: scheduler.solve(synthetic.chain(8), 0.5, solver="chen", time_limit_s=3),
     UnknownOption, "it takes mode"),
    ("solvers.solve: option ilp lacks", lambda: solvers.solve(synthetic.chain(8), 10**9, solver="ilp", k=3),
     UnknownOption, "time_limit_s"),
    ("parse_budget: inf", lambda: parse_budget(math.inf, synthetic.chain(4)), BudgetError, "(0, 1]"),
    ("loads: key typo", lambda: graphs.loads(json.dumps({**_graph_dict(), "nodez": []})), GraphError, "'nodes'"),
    ("from_dict: NaN", lambda: graphs.Graph.from_dict({**_graph_dict(), "input_bytes": math.nan}),
     GraphError, "finite integer"),
    ("Graph(): NaN size", lambda: graphs.Graph((graphs.Node("a", out_bytes=math.nan),)), GraphError, "[0, 2**62)"),
    ("Plan.from_dict: typo", lambda: Plan.from_dict({"regions": [], "fingerprnt": "x"}), PlanError, "fingerprint"),
    ("Plan.from_dict: inf peak", lambda: Plan.from_dict({"regions": [], "peak_bytes": math.inf}), PlanError,
     "finite integer"),
    ("load_plan: directory", lambda: solvers.load_plan(ROOT), PlanError, "is a directory"),
    ("graphs.load: directory", lambda: graphs.load(ROOT), GraphError, "is a directory"),
    ("save into a directory", lambda: graphs.save(synthetic.chain(3), ROOT / "tests"), CkptError, "cannot write"),
    ("Plan: a module path twice", lambda: Plan(regions=((0, 1), (2, 3)), modules=("h.0", "h.0")), PlanError,
     "names module 'h.0' for 2 regions"),
    ("solve: optimizer with a fraction", lambda: scheduler.solve(synthetic.chain(8), 0.5, optimizer="adam"),
     BudgetError, "fractional budget"),
    ("solve: reserve over the budget", lambda: scheduler.solve(synthetic.chain(8), "1GiB", reserve="2GiB"),
     BudgetError, "leaves nothing"),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(case):
    _, call, kind, text = case
    with pytest.raises(kind) as info:
        call()
    assert text in str(info.value) and len(str(info.value).splitlines()) == 1


def test_the_table_is_large_enough():
    assert len(CLI_CASES) + len(API_CASES) >= 60


def test_output_through_a_symlink_writes_its_target(tmp_path):
    """NOTE [ Output files ]: ``-o`` naming a link replaces the file the link points to; the link stays a link."""
    graphs.save(synthetic.transformer(20), tmp_path / "g.json")
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "plan.json"
    target.write_bytes(SENTINEL)
    link = tmp_path / "latest.json"
    os.symlink(os.path.join("runs", "plan.json"), link)
    assert main(["solve", str(tmp_path / "g.json"), "-b", "0.6", "-s", "dp", "-o", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == os.path.join("runs", "plan.json")
    assert target.read_bytes() != SENTINEL and solvers.load_plan(target).regions
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["plan.json"]  # no temporary file left


def test_remove_takes_off_a_region_wrapped_twice():
    """A plan that named one module twice wrapped it twice; ``remove`` restores the user's own forward."""
    from torch import nn

    from scheduler.applying import remove
    from scheduler.applying.regions import RegionForward

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    inner, users = model[0], model[1]
    own = users.forward  # a forward the user set on the instance before any plan
    users.forward = own
    for m in (inner, users):
        first = RegionForward(m, "x", stochastic=False, previous=m.__dict__.get("forward"))
        m.forward = RegionForward(m, "x", stochastic=False, previous=first)
    remove(model)
    assert "forward" not in inner.__dict__ and users.__dict__["forward"] == own


def test_sigint_stops_cp_sat(tmp_path):
    """NOTE [ Ctrl-C during CP-SAT ]: a real SIGINT while CP-SAT searches (this graph keeps it busy for its
    whole 60 s limit): exit 130 within seconds, "interrupted", the existing plan file untouched."""
    graphs.save(synthetic.random_dag(300, seed=1), tmp_path / "g.json")
    (tmp_path / "p.json").write_bytes(SENTINEL)
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "-v", "solve", str(tmp_path / "g.json"), "--budget", "0.5",
         "--method", "cp-sat", "--time-limit", "60", "-o", str(tmp_path / "p.json")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a suite started in the background (`make test &`) inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler: give the child the terminal's default, as a user has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in proc.stderr:  # type: ignore[union-attr]
        lines.append(line)
        if "CP-SAT searching" in line:
            break
    else:
        pytest.fail("CP-SAT never started: " + "".join(lines[-5:]))
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert took < 20  # 0.2 s on an idle machine; generous for a loaded one
    assert (tmp_path / "p.json").read_bytes() == SENTINEL


def test_sigint_handler_survives_cp_sat():
    """After a CP-SAT search Python's own SIGINT handler is in place (OR-Tools used to leave SIG_DFL)."""
    from ortools.sat.python import cp_model

    from solvers.cpsat.run import run_cp_sat

    model = cp_model.CpModel()
    x = model.NewIntVar(0, 10, "x")
    model.Maximize(x)
    before = signal.getsignal(signal.SIGINT)
    assert run_cp_sat(cp_model.CpSolver(), model) == cp_model.OPTIMAL
    assert signal.getsignal(signal.SIGINT) is before


def test_closed_stdout_still_writes_the_plan(tmp_path):
    graphs.save(synthetic.transformer(30), tmp_path / "g.json")
    proc = subprocess.Popen([sys.executable, "-m", "scheduler.cli", "solve", str(tmp_path / "g.json"), "-b", "0.6",
                             "-o", str(tmp_path / "p.json")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # type: ignore[union-attr]  # the reader of `| true` is gone before the first line
    err = proc.stderr.read()  # type: ignore[union-attr]
    assert proc.wait(timeout=120) == 0, err
    assert solvers.load_plan(tmp_path / "p.json").regions and b"Traceback" not in err


def test_dp_without_a_writable_numba_cache(tmp_path):
    """NOTE [ numba's cache ]: only the user-wide locators, $HOME unwritable: dp still answers."""
    env = {**os.environ, "HOME": "/proc/no-home", "XDG_CACHE_HOME": "/proc/no-cache",
           "NUMBA_CACHE_LOCATOR_CLASSES": "UserProvidedCacheLocator,UserWideCacheLocator"}
    env.pop("NUMBA_CACHE_DIR", None)
    code = ("import solvers; from graphs import synthetic; g = synthetic.chain(40); "
            "print(solvers.solve(g, solvers.activation_budget_bytes(g, 0.5), solver='dp').status)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "optimal", res.stderr


def test_unproven_least_peak_is_labelled(monkeypatch):
    """NOTE [ No unproven floor ]: CP-SAT proves the budget infeasible but not the least peak in time."""
    from solvers.cpsat import model as ilp_model
    from solvers.ilp import IlpSolver

    g = synthetic.random_dag(30, seed=0)
    store_all = solvers.simulate(g).peak_bytes
    budget = store_all // 4
    results = iter([ilp_model.ModelResult("infeasible", None, math.nan, math.nan, 0.0),
                    ilp_model.ModelResult("unknown", None, math.nan, float(budget + 1000), 0.0)])
    monkeypatch.setattr(ilp_model.CheckpointModel, "solve", lambda self, **kw: next(results))
    with pytest.raises(InfeasibleBudget) as info:
        IlpSolver(g, budget, time_limit_s=2).solve()
    exc = info.value  # CP-SAT bounds the activations' peak: the whole step's adds the parameters and inputs
    assert not exc.proven and exc.lower_bound_bytes == budget + 1000 + g.param_bytes + g.input_bytes
    assert "least feasible budget is" not in str(exc) and "not proven" in str(exc)
    assert "best proven lower bound: at least" in str(exc)


def test_a_stop_never_advises_a_solver_that_found_nothing(monkeypatch):
    """ilp's time limit passes with no plan after dp, chen and uniform found none under the budget: the message
    names them as tried, and advises only what it has not tried (with no warm start: dp or chen)."""
    import solvers.warm
    from solvers.cpsat import solver as ilp_cpsat
    from solvers.deadline import Deadline
    from solvers.ilp import IlpTimeout

    class Clock:  # moves only when a warm-start plan is tried (NOTE [ Bounded warm starts ]): 1 s each
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock, real = Clock(), solvers.warm._candidates

    def candidates(graph):  # type: ignore[no-untyped-def]
        for source, regions in real(graph):
            yield source, regions
            clock.t += 1.0

    monkeypatch.setattr(solvers.warm, "_candidates", candidates)
    g = synthetic.make("unet", 100)
    budget = solvers.simulate(g).breakdown["params"] + 1  # below every plan's peak
    with pytest.raises(IlpTimeout) as info:
        ilp_cpsat.solve_within(g, budget, Deadline(12.5, clock=clock))  # past chen's, dp's and uniform's first plans
    assert "(dp, chen, uniform found no plan under this budget either)" in str(info.value)
    assert "use solver" not in str(info.value)
    with pytest.raises(IlpTimeout, match="or use solver 'dp' or 'chen'"):
        ilp_cpsat.solve_within(g, budget, Deadline(0.0, clock=clock), warm_start_=False)


def test_heuristic_floor_is_scoped():
    with pytest.raises(InfeasibleBudget) as info:
        scheduler.solve(synthetic.chain(12), 1024, solver="uniform")
    assert "among the plans uniform considers" in str(info.value)
