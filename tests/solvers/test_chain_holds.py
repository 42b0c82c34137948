"""The chain solvers on a graph with forward holds (NOTE [ Chains and forward holds ] in ``solvers.model.stages``).

A hold reads a tensor the user's Python keeps past its last reader; ``x = block(x)`` makes one after every block,
torchvision's ViT encoder one across all of its layers. Such reads cross the articulation cuts ``dp`` and ``chen``
plan over: on a traced GPT, ``dp``'s least feasible budget became store-all's peak. They now cut and plan on the
graph without the reads and check their answers on the graph with them.
"""

from __future__ import annotations

import pytest

import solvers
from graphs import HOLDS_OP, Graph, Node, Span
from solvers import InfeasibleBudget, simulate
from solvers.model.plan import Status
from solvers.model.stages import chain_view, from_chain_view, stages

MB = 1 << 20


def _encoder(blocks: int = 6, *, long_hold: bool = True) -> Graph:
    """An input made by ``pos``, read by the first block alone, held to the end by a hold (as ViT's encoder);
    after each block a hold of that block's input (``x = block(x)``)."""
    nodes = [Node("pos", out_bytes=MB, fwd_flops=10)]
    spans = []
    prev = "pos"
    for b in range(blocks):
        first = len(nodes)
        nodes += [Node(f"b{b}.fc1", inputs=(prev,), out_bytes=4 * MB, fwd_flops=10**6, module=f"blocks.{b}.fc1"),
                  Node(f"b{b}.act", inputs=(f"b{b}.fc1",), out_bytes=4 * MB, fwd_flops=10**4, saves_output=True,
                       saves_inputs=(), module=f"blocks.{b}.act"),
                  Node(f"b{b}.fc2", inputs=(f"b{b}.act",), out_bytes=MB, fwd_flops=10**6, module=f"blocks.{b}.fc2")]
        spans.append(Span(first, len(nodes) - 1, f"blocks.{b}"))
        nodes.append(Node(f"b{b}.holds", inputs=(prev,), op=HOLDS_OP, requires_grad=False, saves_inputs=(),
                          module="blocks"))
        prev = f"b{b}.fc2"
    if long_hold:
        nodes.append(Node("enc.holds", inputs=("pos",), op=HOLDS_OP, requires_grad=False, saves_inputs=()))
    nodes.append(Node("loss", inputs=(prev,), out_bytes=4, fwd_flops=10))
    return Graph(nodes=tuple(nodes), spans=tuple(spans))


def test_the_view_drops_the_reads_and_keeps_positions_and_calls() -> None:
    g = _encoder()
    v = chain_view(g)
    assert len(v) == len(g) and [nd.name for nd in v.nodes] == [nd.name for nd in g.nodes]
    assert all(not nd.inputs for nd in v.nodes if nd.op == HOLDS_OP)
    assert [sp.last for sp in v.spans] == [sp.last + 1 for sp in g.spans[:-1]] + [g.spans[-1].last + 2]  # + holds
    assert from_chain_view(g, [(sp.first, sp.last) for sp in v.spans]) == tuple((sp.first, sp.last) for sp in g.spans)
    assert len(stages(v)) > len(stages(g)) == 3  # the long hold crossed every cut inside the encoder
    small = Graph(nodes=g.nodes[:3])
    assert chain_view(small) is small  # no holds: the graph itself


@pytest.mark.parametrize("solver", ["dp", "chen"])
def test_chain_solvers_plan_blocks_and_fit_with_the_holds(solver: str) -> None:
    g = _encoder()
    store_all = simulate(g).peak_bytes
    budget = int(store_all * 0.6)
    plan = solvers.solve(g, budget, solver=solver)
    assert plan.regions, "regions, not store-all"
    assert all((a, b) in {(sp.first, sp.last) for sp in g.spans} for a, b in plan.regions)
    assert simulate(g, plan).peak_bytes <= budget
    assert plan.status != Status.OPTIMAL  # checked on the graph, optimal on the view only


def test_dp_names_a_floor_it_measured_on_the_graph_with_holds() -> None:
    g = _encoder()
    with pytest.raises(InfeasibleBudget) as exc:
        solvers.solve(g, MB, solver="dp")
    err = exc.value
    assert not err.proven and err.lower_bound_bytes is not None and err.lower_bound_bytes <= err.min_feasible_bytes
    least = solvers.Plan.from_regions(g, list(err.best_regions))
    assert simulate(g, least).peak_bytes == err.min_feasible_bytes
    plan = solvers.solve(g, err.min_feasible_bytes, solver="dp")  # the figure it names is met
    assert simulate(g, plan).peak_bytes <= err.min_feasible_bytes
