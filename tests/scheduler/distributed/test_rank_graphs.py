"""What a rank's graph holds: tensor-parallel splits, FSDP's sharded state and gathered units, a stage's graph."""

from __future__ import annotations

import pytest
import torch

import scheduler
from graphs import Graph, Node, Span
from scheduler.distributed import Layout, LayoutError, rank_graph, rank_state
from scheduler.distributed.fsdp import fsdp_units, lingering_bytes, repeated_blocks, shard_fsdp
from scheduler.distributed.plans import rank_graphs, stage_graphs
from scheduler.distributed.stages import pipeline_buffer_bytes, stage_bounds, stage_starts
from scheduler.distributed.tensor_parallel import split_tensor_parallel, tp_roles
from scheduler.models.staged import StagedLM


@pytest.fixture(scope="module")
def graph() -> Graph:
    torch.manual_seed(0)
    model = StagedLM(vocab=64, width=16, heads=2, layers=4, seq=8).train()
    x = torch.randint(0, 64, (2, 8))
    return scheduler.trace(model, (x, x))


def _by_module(graph: Graph, module: str, split: list[bool]) -> list[bool]:
    return [s for nd, s in zip(graph.nodes, split) if nd.module == module]


def test_tensor_parallelism_splits_from_the_column_matmul_to_the_row_matmul(graph):
    """NOTE [ Tensor-parallel activations ]."""
    split, kinds = tp_roles(graph)
    assert any(_by_module(graph, "layers.0.attn.c_attn", split)), "the qkv projection's output is split"
    sdpa = [s for nd, s in zip(graph.nodes, split) if "scaled_dot_product" in nd.op]
    assert sdpa and all(sdpa), "attention runs on a share of the heads"
    assert not any(_by_module(graph, "layers.0.ln_1", split)), "norms stay whole without sequence parallelism"
    proj = [i for i, nd in enumerate(graph.nodes) if nd.module == "layers.0.attn.c_proj"]
    matmul = max(proj, key=lambda i: graph.nodes[i].fwd_flops)
    assert not split[matmul], "the row-wise matmul's output is whole (all-reduced)"
    assert all(split[j] for j in graph.preds[matmul] if graph.nodes[j].requires_grad), "what it reads is split"
    assert any(_by_module(graph, "layers.0.mlp.act", split)), "the MLP's hidden activation is split"
    tp = split_tensor_parallel(graph, 2)
    for nd, half, s in zip(graph.nodes, tp.nodes, split):
        assert half.out_bytes == (-(-nd.out_bytes // 2) if s else nd.out_bytes)
        assert half.param_bytes == (-(-nd.param_bytes // 2) if kinds[graph.index[nd.name]] else nd.param_bytes)
    assert tp.param_bytes < graph.param_bytes


def test_sequence_parallelism_splits_the_rest_but_the_gathered_inputs(graph):
    sp = split_tensor_parallel(graph, 2, sequence_parallel=True)
    tp = split_tensor_parallel(graph, 2)
    ln = [i for i, nd in enumerate(graph.nodes) if nd.module == "layers.0.ln_1" and nd.out_bytes]
    assert ln and all(sp.nodes[i].out_bytes == graph.nodes[i].out_bytes for i in ln), \
        "the norm's output is what the column-wise linear gathers and saves whole"
    adds = [i for i, nd in enumerate(graph.nodes) if nd.module == "layers.0" and "add" in nd.op]
    assert adds and all(sp.nodes[i].out_bytes < tp.nodes[i].out_bytes for i in adds), "the residual stream is split"
    assert scheduler.simulate(sp).peak_bytes < scheduler.simulate(tp).peak_bytes < scheduler.simulate(graph).peak_bytes


def test_fsdp_shards_the_units_and_charges_what_it_gathers(graph):
    """NOTE [ FSDP2's buffers ]: parameters 1/shard, unit gradients 1/shard, the root's whole, buffers per unit."""
    assert repeated_blocks(graph) == tuple(f"layers.{i}" for i in range(4))
    unit_of, units, root = fsdp_units(graph)
    assert [u.module for u in units] == [f"layers.{i}" for i in range(4)]
    assert root.param_bytes + sum(u.param_bytes for u in units) == graph.param_bytes
    sharded = shard_fsdp(graph, 4, forward_prefetch=0)
    assert sharded.param_bytes == -(-graph.param_bytes // 4)
    size = units[1].param_bytes
    for i, (nd, new) in enumerate(zip(graph.nodes, sharded.nodes)):
        if unit_of[i] == 1:  # a middle unit: 2 own + 2 before + 1 after (backward) > 2 own + before (forward)
            assert new.param_bytes == -(-nd.param_bytes // 4)
            assert new.workspace_bytes - nd.workspace_bytes == root.param_bytes + 5 * size
        elif unit_of[i] == -1:
            assert new.param_bytes == nd.param_bytes
            assert new.workspace_bytes - nd.workspace_bytes == root.param_bytes + 2 * size
    with pytest.raises(LayoutError, match="no submodule call"):
        fsdp_units(graph, ["layers.9"])


def test_gloo_threads_charge_the_largest_collective_buffers_everywhere(graph):
    """NOTE [ FSDP2's buffers ]: each of gloo's worker threads may still hold the last collective it ran."""
    _, units, root = fsdp_units(graph)
    two = sorted([u.param_bytes for u in units] + [root.param_bytes], reverse=True)[:2]
    assert lingering_bytes(units, root, 0) == 0 and lingering_bytes(units, root, 2) == sum(two)
    plain = shard_fsdp(graph, 4, forward_prefetch=0)
    gloo = shard_fsdp(graph, 4, forward_prefetch=0, collective_threads=2)
    assert [b.workspace_bytes - a.workspace_bytes for a, b in zip(plain.nodes, gloo.nodes)] == [sum(two)] * len(
        graph.nodes)
    assert rank_graph(graph, Layout(shard=4, forward_prefetch=0, collective_threads=2)) == gloo


def test_a_ranks_state_shards_the_optimizer(graph):
    one = rank_state(graph, Layout(), optimizer="adam")
    four = rank_state(graph, Layout(shard=4), optimizer="adam")
    assert four.optimizer_bytes == -(-one.optimizer_bytes // 4) and one.optimizer_bytes == 2 * graph.param_bytes
    assert rank_state(graph, Layout(tp=2), optimizer="adam").optimizer_bytes < one.optimizer_bytes


def test_balanced_stages_cut_at_blocks_and_given_ones_are_kept(graph):
    """NOTE [ Balanced stages ]."""
    assert stage_starts(graph, Layout(pp=2, microbatches=2)) == ("layers.2",)
    assert stage_starts(graph, Layout(pp=4, microbatches=4)) == ("layers.1", "layers.2", "layers.3")
    given = Layout(pp=2, microbatches=2, stage_starts=("layers.3",))
    bounds = stage_bounds(graph, given)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(graph.nodes) - 1 and bounds[1][0] == bounds[0][1] + 1
    assert graph.nodes[bounds[1][0]].module.startswith("layers.3")
    with pytest.raises(LayoutError, match="no submodule call"):
        stage_bounds(graph, Layout(pp=2, microbatches=2, stage_starts=("layers.9",)))
    with pytest.raises(LayoutError, match="not in the model's order"):
        stage_bounds(graph, Layout(pp=3, microbatches=3, stage_starts=("layers.3", "layers.1")))
    with pytest.raises(LayoutError, match="at least 8 repeated blocks"):
        stage_bounds(graph, Layout(pp=8, microbatches=8))


def test_a_stages_graph_receives_what_crosses_and_keeps_module_paths(graph):
    """NOTE [ A stage's graph ]."""
    layout = Layout(pp=2, microbatches=4)
    first, second = stage_graphs(graph, layout)
    received = [nd for nd in second.nodes if nd.op == "stage_input"]
    assert received and all(not nd.recomputable for nd in received)
    assert any(nd.requires_grad for nd in received), "the hidden state it receives has a gradient"
    names = {nd.name for nd in received}
    assert any(names & set(nd.saves_inputs) for nd in second.nodes), "its first reader holds what it receives"
    assert {sp.module for sp in second.spans} >= {"layers.2", "layers.3", "head"}
    assert not {sp.module for sp in second.spans} & {"layers.0", "embed"}
    assert first.param_bytes + second.param_bytes == graph.param_bytes
    assert "parameters" not in second.meta and second.meta["stage"]["index"] == 1
    # the pipeline's buffers: the receive buffers not in flight, the gradients sent back, inputs, the head's output
    out = second.nodes[-1]
    logits = sum(second.nodes[second.index[n]].out_bytes for n in dict.fromkeys(out.inputs)
                 if second.nodes[second.index[n]].requires_grad and n not in out.saves_inputs)
    assert pipeline_buffer_bytes(second, 4, 1) == (3 * sum(nd.out_bytes for nd in received) + 3 * second.input_bytes
                                                   + logits)
    assert pipeline_buffer_bytes(first, 4, 2) == 4 * first.nodes[-1].out_bytes + 3 * first.input_bytes
    ranks = rank_graphs(graph, layout)
    assert ranks[0].input_bytes == first.input_bytes + pipeline_buffer_bytes(first, 4, 2)


def test_a_whole_model_rank_graph_is_the_graph_itself(graph):
    assert rank_graph(graph, Layout()) is graph
    assert stage_graphs(graph, Layout(microbatches=4)) == [graph]


def _chain(n: int) -> Graph:
    nodes = [Node(f"n{i}", inputs=(f"n{i - 1}",) if i else (), out_bytes=100, fwd_flops=10, module=f"blocks.{i}",
                  param_bytes=40) for i in range(n)]
    return Graph(nodes, param_bytes=40 * n, input_bytes=10, spans=[Span(i, i, f"blocks.{i}") for i in range(n)])


def test_balanced_stages_minimise_the_slowest_stage():
    g = _chain(6)
    costs = [1, 1, 1, 1, 1, 5]
    g = g.with_nodes([n.__class__(**{**n.__dict__, "fwd_flops": c, "fwd_cost": c, "bwd_flops": 0})
                      for n, c in zip(g.nodes, costs)])
    assert stage_bounds(g, Layout(pp=2, microbatches=2)) == ((0, 4), (5, 5))
    assert stage_bounds(g, Layout(pp=3, microbatches=3)) == ((0, 2), (3, 4), (5, 5))


def test_a_stage_whose_solve_stops_has_no_plan(graph, monkeypatch):
    """An inner solver stopped by its time limit (``STOPPED``) leaves its stage without a plan; nothing raises."""
    import solvers
    from scheduler.distributed import solve_layout
    from solvers.ilp import IlpTimeout

    def stopped(*args, **kwargs):
        raise IlpTimeout("no plan found within 0 s")

    monkeypatch.setattr(solvers, "solve", stopped)
    monkeypatch.setattr(solvers, "get_solver", lambda name: stopped)
    for layout in (Layout(pp=2, microbatches=2), Layout(shard=2)):
        plans = solve_layout(graph, "1GiB", layout, strict=False)
        assert not plans.fits and all(s.plan is None and s.needs_bytes is None for s in plans.stages)


def test_a_stage_holds_its_own_frozen_parameters():
    """NOTE [ A stage's graph ]: frozen weights (a base under adapters) go to the stage that uses them. Each stage
    once got the whole model's frozen bytes beside its own parameters, and every stage after the first was refused
    ("frozen_param_bytes exceeds param_bytes"): a peft LoRA model could not be planned for a pipeline."""
    torch.manual_seed(0)
    model = StagedLM(vocab=64, width=16, heads=2, layers=4, seq=8).train()
    for name, p in model.named_parameters():
        p.requires_grad_(not (name.startswith("layers.") and "attn" not in name))  # every block's MLP and norms
    x = torch.randint(0, 64, (2, 8))
    graph = scheduler.trace(model, (x, x))
    assert graph.frozen_param_bytes == sum(p.nbytes for p in model.parameters() if not p.requires_grad)
    layout = Layout(pp=2, microbatches=2)
    stages = stage_graphs(graph, layout)
    assert len(stages) == 2
    for stage in stages:
        assert 0 < stage.frozen_param_bytes < graph.frozen_param_bytes <= graph.param_bytes
        assert stage.frozen_param_bytes < stage.param_bytes
    assert sum(s.frozen_param_bytes for s in stages) == graph.frozen_param_bytes
    assert sum(s.param_bytes for s in stages) == graph.param_bytes  # no weight is tied across these stages
    assert scheduler.solve(graph, "1GiB", layout=layout).fits
    with pytest.raises(LayoutError, match="frozen.*without --fsdp") as info:  # FSDP's gathers of frozen weights
        scheduler.solve(graph, "1GiB", layout=Layout(shard=2))
    assert "\n" not in str(info.value)
