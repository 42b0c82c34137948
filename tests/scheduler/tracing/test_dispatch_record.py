"""What the tracer records for selective recompute (NOTE [ Which op a policy keeps ]),
the menu's reach rule (NOTE [ The menu of kept sets ]) and the policy's counting
(NOTE [ Selective checkpoint policies ])."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

import scheduler
from graphs import Graph, Node
from scheduler.applying import KeptOpsDropped, RegionPolicy
from solvers import Plan, PlanError
from solvers.model.selective import GrowingMenus, last_savers, recompute_reach, variants


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        # tanh saves its output: a region over the whole net recomputes up to it, fc2's call included
        return torch.tanh(self.fc2(self.bn(self.drop(self.act(self.fc1(x)))))).sum()


@pytest.fixture(scope="module")
def graph() -> Graph:
    torch.manual_seed(0)
    return scheduler.trace(Net(), (torch.randn(8, 16),), granularity="op")


def _by_module(graph: Graph, module: str) -> list[Node]:
    return [nd for nd in graph.nodes if nd.module == module]


def test_keepable_nodes_name_their_one_creating_call(graph):
    fc1 = [nd for nd in _by_module(graph, "fc1") if nd.out_bytes]
    assert len(fc1) == 1 and fc1[0].sac_op >= 0
    assert fc1[0].dispatch[fc1[0].sac_op] == "aten.addmm.default"
    relu = [nd for nd in _by_module(graph, "act") if nd.out_bytes]
    assert relu[0].dispatch[relu[0].sac_op] == "aten.relu.default"
    # every keepable node's other calls are views or relabellings
    for nd in graph.nodes:
        assert nd.sac_op == -1 or 0 <= nd.sac_op < len(nd.dispatch)


def test_random_and_stateful_nodes_are_not_keepable(graph):
    assert all(nd.sac_op == -1 for nd in graph.nodes if nd.stochastic)
    assert any(nd.stochastic for nd in graph.nodes)
    bn = [nd for nd in graph.nodes if nd.stateful]
    assert bn and all(nd.sac_op == -1 for nd in bn)


def test_no_detach_is_recorded(graph):
    assert all("aten.detach.default" not in nd.dispatch for nd in graph.nodes)


def test_graph_json_round_trips_and_old_files_without_the_fields_load(graph, tmp_path):
    again = Graph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert [(n.dispatch, n.sac_op) for n in again.nodes] == [(n.dispatch, n.sac_op) for n in graph.nodes]
    old = graph.to_dict()
    for nd in old["nodes"]:
        del nd["dispatch"], nd["sac_op"]
    loaded = Graph.from_dict(old)
    assert all(nd.sac_op == -1 and nd.dispatch == () for nd in loaded.nodes)
    assert loaded.fingerprint() == graph.fingerprint()


def test_save_ops_count_calls_from_the_region_start(graph):
    keep = [i for i, nd in enumerate(graph.nodes) if nd.sac_op >= 0 and nd.dispatch[nd.sac_op] == "aten.addmm.default"]
    assert len(keep) == 2
    plan = Plan.from_regions(graph, [(0, len(graph) - 1)], saved=(keep[1],))
    assert plan.save_ops == ((("aten.addmm.default", 1),),)
    assert plan.save_op_calls == ((("aten.addmm.default", 2),),)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.save_ops == plan.save_ops and again.save_op_calls == plan.save_op_calls
    assert "save_op_calls" not in Plan.from_regions(graph, [(0, 1)]).to_dict()  # plain plans read as before


# ------------------------------------------------------------------- the menu's reach
def _chain(last: str) -> Graph:
    """a -> b -> c; a saves nothing, b its input, c ``last`` ("nothing", "input" or "output")."""
    nodes = [Node("a", out_bytes=10, fwd_flops=5, saves_inputs=()),
             Node("b", inputs=("a",), out_bytes=10, fwd_flops=5),
             Node("c", inputs=("b",), out_bytes=10, fwd_flops=5, saves_inputs=("b",) if last == "input" else (),
                  saves_output=last == "output")]
    return Graph(nodes=tuple(Node(**{**nd.__dict__, "dispatch": ("op",), "sac_op": 0}) for nd in nodes))


def test_menu_offers_only_nodes_the_recompute_reaches():
    g = _chain("nothing")
    assert last_savers(g) == [-1, 1, 1]
    # b saves only its input, packed before b's call: the recompute stops there, b's call never runs
    assert recompute_reach(g) == [-1, 0, 0]
    assert variants(g, 0, 2, limit=8) == [(), (0,)]  # b stops the recompute before its call; c comes after
    assert variants(g, 1, 2) == [()] and variants(g, 2, 2) == [()]
    assert variants(g, 0, 0) == [()]  # a saves nothing: the region is never recomputed at all
    g_in = _chain("input")
    assert recompute_reach(g_in) == [-1, 0, 1]
    assert variants(g_in, 0, 2, limit=8) == [(), (0,), (0, 1)]  # c stops it inside its own call
    g_out = _chain("output")
    assert recompute_reach(g_out) == [-1, 0, 2]  # c's output is packed after its call
    assert max(len(e) for e in variants(g_out, 0, 2, limit=8)) == 3
    for gr in (g, g_in, g_out):
        menus = GrowingMenus(gr, limit=8)
        for a in range(3):
            for b in range(a, 3):
                assert menus.of(a, b) == variants(gr, a, b, limit=8), (a, b)


def test_a_plan_keeping_a_node_the_recompute_never_reaches_is_refused():
    g = _chain("input")
    Plan(regions=((0, 2),), saved=(1,)).validate(g)
    with pytest.raises(PlanError, match="never reaches"):
        Plan(regions=((0, 2),), saved=(2,)).validate(g)
    with pytest.raises(PlanError, match="never reaches"):
        Plan(regions=((0, 1),), saved=(1,)).validate(g)


# ------------------------------------------------------------------- the policy
def test_policy_counts_per_overload_and_pauses():
    pol = RegionPolicy("blocks.0", [("aten.mm.default", 1)])
    mm, add = torch.ops.aten.mm.default, torch.ops.aten.add.Tensor
    pol.reset()
    assert pol(None, mm) is CheckpointPolicy.PREFER_RECOMPUTE
    assert pol(None, add) is CheckpointPolicy.PREFER_RECOMPUTE
    with pol.pause():
        assert pol(None, mm) is CheckpointPolicy.PREFER_RECOMPUTE  # not counted
    assert pol(None, mm) is CheckpointPolicy.MUST_SAVE
    assert pol.settle() == {}
    pol.reset()
    pol(None, mm)
    with pytest.warns(KeptOpsDropped,
                      match=r"region 'blocks.0'.*aten.mm.default: call 1 \(from 0\) kept, called 1 time"):
        assert set(pol.settle()) == {"aten.mm.default"}
    pol.reset()
    pol(None, mm)
    assert pol(None, mm) is CheckpointPolicy.PREFER_RECOMPUTE, "an overload turned off stays off"
    counted = RegionPolicy("blocks.0", [("aten.mm.default", 2)], [("aten.mm.default", 3)])
    counted.reset()
    for _ in range(3):
        counted(None, mm)
    assert counted.saved == [("aten.mm.default", 2)]
    assert counted(None, mm) is CheckpointPolicy.PREFER_RECOMPUTE, "a fourth call: more than traced"
    assert counted.saved == [] and "aten.mm.default" in counted.off
    with pytest.warns(KeptOpsDropped, match=r"called more than the 3 time"):
        counted.settle()


class _Constant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return (self.lin(x) * torch.tensor(2.0)).sum()


def test_a_constant_export_lifts_is_not_keepable():
    """export turns ``torch.tensor(2.0)`` in forward into a ``lift_fresh_copy`` call the eager forward never
    dispatches; a policy keeping it would wait for it (transformers' GPT-2 raised SaveOpsMismatch, before
    such calls were recomputed instead)."""
    g = scheduler.trace(_Constant(), (torch.randn(4, 8),), method="export")
    lifted = [nd for nd in g.nodes if any(op.startswith("aten.lift_fresh") for op in nd.dispatch)]
    assert lifted and all(nd.sac_op == -1 for nd in lifted)
    assert any(nd.sac_op >= 0 for nd in g.nodes)  # the linear and the product stay keepable


def test_a_kept_tensor_written_in_place_is_recomputed_and_taken_once():
    """NOTE [ Kept calls that do not come ], [ Double backward through kept calls ]: the recompute gets a kept
    tensor once, and nothing (the call runs again) when it was written in place since it was kept."""
    from scheduler.applying.selective import _detached, _Store

    mm = torch.ops.aten.mm.default
    store = _Store()
    t = torch.ones(2, 2)
    store.entries[(mm, 0)] = _detached(t)
    store.entries[(mm, 1)] = _detached(torch.zeros(2))
    assert torch.equal(store.take((mm, 0)), t)
    assert store.take((mm, 0)) is None, "taken once: a second backward recomputes it"
    kept = store.entries[(mm, 1)].tensor
    kept.add_(1)  # shares the version counter of what the forward returned
    assert store.take((mm, 1)) is None
    store.entries[(mm, 2)] = _detached(torch.zeros(2))
    store.let_go("aten.mm.default")
    assert not store.entries
    # kept below autograd, in the forward's mode: the alias still shares the version counter of the output
    from scheduler.applying.selective import _Keeping

    pol = RegionPolicy("r", [("aten.mm.default", 0)])
    pol.reset(store)
    x = torch.randn(3, 3, requires_grad=True)
    with _Keeping(pol, store):
        y = x @ x
    assert list(store.entries) == [(mm, 0)] and store.entries[(mm, 0)].tensor.data_ptr() == y.data_ptr()
    with torch.no_grad():
        y.add_(1)
    assert store.take((mm, 0)) is None
