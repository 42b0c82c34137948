"""Reading a graph under a caller's check (NOTE [ Reading a graph under a deadline ] in ``graphs.reading``).

No clock here: a check that raises at its k-th call stands for a deadline that ran out there, so every test
gives the same result on an idle and on a busy machine.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import graphs
from graphs import GraphError, Node, synthetic
from graphs import reading
from graphs.reading import checking
from solvers import simulate

EVERY = 64  # polls this many nodes apart here (CHECK_EVERY, 1024 by default: the same code, a smaller graph)
N = 2 * EVERY + 30  # every phase polls mid-way at least twice


@pytest.fixture(autouse=True)
def every(monkeypatch):
    monkeypatch.setattr(reading, "CHECK_EVERY", EVERY)


class Stop(Exception):
    pass


def _calls(path) -> list[str]:
    calls: list[str] = []
    graphs.load(path, check=calls.append)
    return calls


@pytest.fixture(scope="module")
def chain_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reading") / "chain.json"
    graphs.save(synthetic.make("hetero-chain", N), str(path))
    return path


def test_a_check_is_called_in_every_phase_of_reading_at_most_check_every_nodes_apart(chain_file):
    calls = _calls(chain_file)
    for phase in ("reading the graph's file", "parsing the graph's JSON", "building the graph's nodes",
                  "ordering the graph's nodes", "checking the graph"):
        assert any(c.startswith(phase) for c in calls), phase
    # each node-by-node phase polls at least every EVERY nodes: N nodes, at least N // EVERY polls
    for phase in ("parsing the graph's JSON (", "building the graph's nodes (", "checking the graph ("):
        assert sum(c.startswith(phase) for c in calls) >= N // EVERY, phase


def test_a_check_that_raises_stops_reading_where_it_is_called(chain_file):
    calls = _calls(chain_file)
    for k in range(len(calls)):  # a deadline that runs out at each poll in turn: reading stops right there
        seen: list[str] = []

        def check(what: str) -> None:
            seen.append(what)
            if len(seen) == k + 1:
                raise Stop(what)

        with pytest.raises(Stop) as info:
            graphs.load(chain_file, check=check)
        assert str(info.value) == calls[k] and len(seen) == k + 1


def test_reading_with_a_check_gives_the_same_graph(chain_file):
    plain = graphs.load(chain_file)
    checked = graphs.load(chain_file, check=lambda what: None)
    assert checked == plain and checked.fingerprint() == plain.fingerprint()
    assert graphs.loads(graphs.dumps(plain)) == plain


@pytest.mark.parametrize("text, needle", [
    ('{"nodes": [{"name": "a", "out_bytes": 1, "fwd_flops": 1, "inputs": []}], "param_bytes": NaN}', "NaN"),
    ('{"nodes": [{"name": "a", "out_bytes": 1, "fwd_flops": 1, "inputs": []}]} trailing', "not valid JSON"),
    ('{"nodes": [{"name": "a", "out_bytes": 1, "fwd_flops": 1, "inputs": []},]}', "not valid JSON"),
    ('[1, 2]', "a graph must be a JSON object"),
    ('{"nodes": [{"name": "a", "out_bytes": -1, "fwd_flops": 1, "inputs": []}]}', "negative"),
    ('{"nodes": [{"name": "a", "out_bytes": 1, "fwd_flops": 1, "inputs": [], "param_byte": 3}]}', "param_bytes"),
])
def test_a_bad_file_read_under_a_check_fails_as_without_one(tmp_path, text, needle):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(GraphError) as plain:
        graphs.load(path)
    with pytest.raises(GraphError) as checked:
        graphs.load(path, check=lambda what: None)
    assert str(checked.value) == str(plain.value) and needle in str(plain.value)


def test_nodes_read_quickly_are_the_constructors_nodes():
    """``graphs.schema`` builds nodes of plain JSON without the dataclass's ``__init__``: the same nodes, the
    same JSON (fields in their order), the defaults filled as the constructor fills them."""
    g = synthetic.make("transformer", 40, saveable=0.5)
    for node in g.nodes:
        d = node.to_dict()
        read = Node.from_dict(json.loads(json.dumps(d)))
        fields = [f.name for f in dataclasses.fields(Node) if f.name != "rows" or node.rows]  # rows: when known
        assert read == node and list(read.to_dict()) == fields
        assert read.to_dict() == d
    bare = Node.from_dict({"name": "x", "out_bytes": 8, "fwd_flops": 5, "inputs": ["a"]})
    assert bare == Node("x", ("a",), 8, 5, 10) and bare.fwd_cost == 5 and bare.saves_inputs == ("a",)
    assert Node.from_dict({"name": "x", "out_bytes": 8.0, "fwd_flops": 5, "inputs": []}).out_bytes == 8  # float


def test_simulate_polls_a_check_set_around_it(chain_file):
    g = graphs.load(chain_file)
    seen: list[str] = []
    with checking(seen.append):
        simulate(g)
    assert any(w.startswith("simulating the step's forward (") for w in seen)
    assert any(w.startswith("simulating the step's backward (") for w in seen)
    assert sum(w.startswith("simulating") for w in seen) >= 2 * (N // EVERY)

    def stop(what: str) -> None:
        raise Stop(what)

    with checking(stop), pytest.raises(Stop):
        simulate(graphs.load(chain_file))  # a fresh graph: its tables are derived under the check too
    simulate(g)  # outside the block: no check


def test_no_garbage_collection_while_reading(chain_file):
    """Two full collections of the parsed file's objects were pauses of up to 1.5 s at a load of 8 between two
    polls; reading makes no cycles, so the collector is off while it runs, and back on after, error or not."""
    import gc

    states: list[bool] = []
    graphs.load(chain_file, check=lambda what: states.append(gc.isenabled()))
    assert states and not any(states) and gc.isenabled()
    with pytest.raises(Stop):
        graphs.load(chain_file, check=lambda what: (_ for _ in ()).throw(Stop(what)))
    assert gc.isenabled()
