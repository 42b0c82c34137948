"""The graph type: JSON round trip, defaults, and clear errors on bad input."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphs
from graphs import Graph, GraphError, Node, synthetic


@st.composite
def graphs_strategy(draw):
    n = draw(st.integers(1, 12))
    nodes = []
    for i in range(n):
        inputs = tuple(sorted(draw(st.sets(st.sampled_from([f"v{j}" for j in range(i)]), max_size=3)))) if i else ()
        saves = tuple(x for x in inputs if draw(st.booleans()))
        nodes.append(Node(
            name=f"v{i}", inputs=inputs, saves_inputs=saves,
            out_bytes=draw(st.integers(0, 2**40)), fwd_flops=draw(st.integers(0, 2**50)),
            bwd_flops=draw(st.integers(0, 2**50)), saved_bytes=draw(st.integers(0, 2**30)),
            workspace_bytes=draw(st.integers(0, 2**30)), param_bytes=draw(st.integers(0, 2**30)),
            saves_output=draw(st.booleans()), stochastic=draw(st.booleans()), stateful=draw(st.booleans()),
            recomputable=draw(st.booleans()), requires_grad=draw(st.booleans()),
            op=draw(st.text(max_size=8)), module=draw(st.text(max_size=8)),
        ))
    meta = draw(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3))
    params = draw(st.integers(0, 2**40))
    outputs = tuple(sorted(draw(st.sets(st.sampled_from([nd.name for nd in nodes]), max_size=3))))
    return Graph(nodes=tuple(nodes), param_bytes=params, frozen_param_bytes=draw(st.integers(0, params)),
                 input_bytes=draw(st.integers(0, 2**40)), name=draw(st.text(max_size=10)), meta=meta,
                 outputs=outputs, loop=draw(st.sampled_from(graphs.LOOPS)))


@settings(max_examples=150, deadline=None)
@given(graphs_strategy())
def test_json_round_trip_is_exact(g):
    back = graphs.loads(graphs.dumps(g))
    assert back == g
    assert back.fingerprint() == g.fingerprint()


def test_file_round_trip(tmp_path):
    g = synthetic.unet(40, seed=3)
    graphs.save(g, tmp_path / "g.json")
    assert graphs.load(tmp_path / "g.json") == g


def test_minimal_hand_written_file_gets_documented_defaults(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"nodes": [
        {"name": "x", "out_bytes": 8, "fwd_flops": 5, "inputs": []},
        {"name": "y", "out_bytes": 8, "fwd_flops": 7, "inputs": ["x"]},
    ]}))
    g = graphs.load(path)
    y = g.nodes[1]
    assert y.bwd_flops == 14 and y.saves_inputs == ("x",) and not y.saves_output
    assert y.saved_bytes == y.workspace_bytes == y.param_bytes == 0
    assert y.requires_grad and y.recomputable and not y.stochastic and not y.stateful
    assert g.param_bytes == g.input_bytes == 0


def test_nodes_listed_out_of_order_are_sorted():
    g = Graph.from_dict({"nodes": [
        {"name": "y", "out_bytes": 1, "fwd_flops": 1, "inputs": ["x"]},
        {"name": "x", "out_bytes": 1, "fwd_flops": 1, "inputs": []},
    ]})
    assert [n.name for n in g.nodes] == ["x", "y"]


def _node(**kw):
    d = {"name": "a", "out_bytes": 1, "fwd_flops": 1, "inputs": []}
    d.update(kw)
    return d


BAD = {
    "missing field": ({"nodes": [{"name": "a", "fwd_flops": 1, "inputs": []}]}, "missing required field 'out_bytes'"),
    "missing nodes": ({"format": 1}, "'nodes'"),
    "unknown input": ({"nodes": [_node(inputs=["ghost"])]}, "input 'ghost' is not a node"),
    "cycle": ({"nodes": [_node(name="a", inputs=["b"]), _node(name="b", inputs=["a"])]}, "cycle"),
    "self loop": ({"nodes": [_node(name="a", inputs=["a"])]}, "cycle"),
    "negative bytes": ({"nodes": [_node(out_bytes=-4)]}, "'out_bytes' is negative"),
    "wrong version": ({"format": 99, "nodes": [_node()]}, "format version 99"),
    "duplicate": ({"nodes": [_node(), _node()]}, "appears twice"),
    "bad type": ({"nodes": [_node(fwd_flops="many")]}, "'fwd_flops' must be an integer"),
    "unknown field": ({"nodes": [_node(colour="red")]}, "unknown field"),
    "saves non-input": ({"nodes": [_node(name="x"), _node(name="y", inputs=["x"], saves_inputs=["z"])]},
                        "saves_inputs names 'z'"),
    "empty": ({"nodes": []}, "no nodes"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_graph_json_raises_clear_error(case, tmp_path):
    data, expected = BAD[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GraphError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        graphs.load(path)


def test_not_json_and_missing_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{nodes: oops")
    with pytest.raises(GraphError, match="not valid JSON"):
        graphs.load(path)
    with pytest.raises(GraphError, match="does not exist"):
        graphs.load(tmp_path / "nope.json")


@pytest.mark.parametrize("family", sorted(synthetic.FAMILIES))
def test_generators_are_seeded_and_sized(family):
    a = synthetic.make(family, 60, seed=7)
    assert a == synthetic.make(family, 60, seed=7)
    assert 40 <= len(a) <= 80
    if family not in ("chain",):
        assert a != synthetic.make(family, 60, seed=8) or family == "transformer"


def test_residual_and_unet_have_skips():
    g = synthetic.unet(40, seed=0)
    span = max(i - j for i, ps in enumerate(g.preds) for j in ps)
    assert span > 10  # a long skip from encoder to decoder
    r = synthetic.residual(20, k=3)
    assert any(len(ps) == 2 for ps in r.preds)


def test_unknown_family():
    with pytest.raises(ValueError, match="unknown graph family"):
        synthetic.make("mobius", 10)


def test_unet_sizes_mirror_the_encoder_at_any_depth():
    g = synthetic.unet(1200, seed=0)
    assert max(n.out_bytes for n in g.nodes) == g.nodes[0].out_bytes  # no growth past the input resolution
    assert len(g) <= 1210


def test_unsorted_graph_sorts_in_linear_time():
    """NOTE [ Strict loading ] / toposort: 20,000 nodes listed in reverse took over 300 s (quadratic)."""
    import time

    g = synthetic.chain(20_000)
    d = g.to_dict()
    d["nodes"] = d["nodes"][::-1]
    t0 = time.perf_counter()
    assert Graph.from_dict(d) == g
    assert time.perf_counter() - t0 < 60  # ~0.5 s; generous for a loaded machine


def test_toposort_is_stable():
    """Nodes ready together keep the order they were listed in."""
    d = {"nodes": [
        {"name": "c", "inputs": ["a"], "out_bytes": 1, "fwd_flops": 1},
        {"name": "a", "inputs": [], "out_bytes": 1, "fwd_flops": 1},
        {"name": "b", "inputs": [], "out_bytes": 1, "fwd_flops": 1},
        {"name": "d", "inputs": ["a"], "out_bytes": 1, "fwd_flops": 1},
    ]}
    assert [n.name for n in Graph.from_dict(d).nodes] == ["a", "b", "c", "d"]


# --------------------------------------------------------------- the user's loop, frozen parameters
def _two_nodes(**fields):
    return Graph(nodes=(Node("x", out_bytes=8, fwd_flops=1), Node("y", inputs=("x",), out_bytes=4, fwd_flops=1)),
                 param_bytes=100, **fields)


def test_outputs_loop_and_frozen_bytes_are_written_only_when_set():
    # NOTE [ The user's loop ]: files written before these fields read as before (no outputs, all trained)
    plain = _two_nodes()
    d = plain.to_dict()
    assert not {"outputs", "loop", "frozen_param_bytes"} & set(d)
    back = Graph.from_dict(d)
    assert back == plain and back.outputs == () and back.held_outputs() == () and back.frozen_param_bytes == 0
    g = _two_nodes(outputs=("x",), loop="dropped", frozen_param_bytes=60)
    d = g.to_dict()
    assert (d["outputs"], d["loop"], d["frozen_param_bytes"]) == (["x"], "dropped", 60)
    assert Graph.from_dict(json.loads(json.dumps(d))) == g
    assert g.held_outputs() == () and g.with_loop("held").held_outputs() == (0,)
    assert g.unattributed_grad_bytes() == 40  # the trained parameters' gradients, none for the frozen 60


def test_the_loop_is_no_part_of_the_fingerprint():
    # a plan for one loop applies in the other (what it does is the same; only its peak differs)
    g = _two_nodes(outputs=("x",))
    assert g.fingerprint() == g.with_loop("dropped").fingerprint() == _two_nodes().fingerprint()


@pytest.mark.parametrize("fields,match", [
    ({"loop": "kept"}, "'loop' must be one of 'held', 'dropped'"),
    ({"outputs": ("z",)}, "'outputs' names 'z', which is not a node"),
    ({"frozen_param_bytes": 101}, "exceeds 'param_bytes'"),
])
def test_bad_loop_fields_are_refused(fields, match):
    with pytest.raises(GraphError, match=match):
        _two_nodes(**fields)
    d = _two_nodes().to_dict()
    d.update({k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()})
    with pytest.raises(GraphError, match=match):
        Graph.from_dict(d)
