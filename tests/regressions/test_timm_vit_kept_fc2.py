"""A kept node whose call the recompute never reaches is never offered, and a plan keeping one is refused.

timm's ``vit_small_patch16_224(img_size=128)``, batch 8: ``dp``'s default
(selective) plan kept each checkpointed block's ``mlp.fc2`` output. The block
ends ``fc2 -> Dropout(p=0) -> residual add``: the dropout is no op and the add
saves nothing, so ``fc2`` is the last node that saves a tensor, and it saves
only its input, which autograd packs *before* the op runs. Non-reentrant
checkpoint stops the recompute at that pack, the kept ``addmm`` is never read
back from the cache, and its output stays held to the end of the block's
backward: measured 798,720 bytes (one ``[8, 65, 384]`` fp32 tensor) above the
prediction and the budget (NOTE [ The menu of kept sets ] in ``solvers.model.selective``).
Reproduced here on a timm-like ViT (``tests/timm_like.py``) by tensor storages
(``workspaces="none"``, so the count and the graph see the same tensors).
"""

import pytest
import torch

import scheduler
from scheduler.measuring.storages import measure_step
from scheduler.tracing.tracer import capture
from solvers import Plan, PlanError, simulate
from solvers.model.selective import recompute_reach
from timm_like import vit_example


@pytest.fixture(scope="module")
def vit():
    model, x, _, loss = vit_example(batch=8, image=32, dim=96, depth=4)
    graph = capture(model, (x,), loss=loss, workspaces="none", costs="flops").graph
    return model, x, loss, graph


def _measured(vit, plan: Plan) -> int:
    model, x, loss, _ = vit
    scheduler.apply(model, plan)
    try:
        torch.manual_seed(0)
        return measure_step(model, (x,), loss=loss).peak_bytes
    finally:
        scheduler.remove(model)


def _block0(graph):
    span = next(sp for sp in graph.spans if sp.module == "blocks.0")
    [fc2] = [i for i, nd in enumerate(graph.nodes) if nd.module == "blocks.0.mlp.fc2" and nd.out_bytes]
    [sdpa] = [i for i, nd in enumerate(graph.nodes) if nd.module == "blocks.0.attn" and "attention" in nd.op]
    return span.first, span.last, fc2, sdpa


def test_a_kept_fc2_stays_cached_to_the_blocks_backward(vit):
    graph = vit[3]
    first, last, fc2, sdpa = _block0(graph)
    assert graph.nodes[fc2].saves_inputs and not graph.nodes[fc2].saves_output and not graph.nodes[fc2].saved_bytes
    assert recompute_reach(graph)[last] == fc2 - 1  # the recompute stops inside fc2, before its call
    kept_sdpa = Plan.from_regions(graph, [(first, last)], saved=(sdpa,))
    assert _measured(vit, kept_sdpa) == simulate(graph, kept_sdpa).peak_bytes
    both = Plan(regions=((first, last),), saved=(sdpa, fc2), fingerprint=graph.fingerprint(), graph_name=graph.name,
                graph_meta=graph.meta).labelled(graph)  # the plan dp used to make
    with pytest.raises(PlanError, match="never reaches"):
        simulate(graph, both)
    assert _measured(vit, both) == _measured(vit, kept_sdpa) + graph.nodes[fc2].out_bytes


@pytest.mark.parametrize("fraction", [0.7, 0.75])
def test_dps_selective_plans_measure_as_predicted(vit, fraction):
    # at 0.7, dp kept every checkpointed block's fc2 and measured 52,224 bytes (one fc2 output) over
    graph = vit[3]
    plan = scheduler.solve(graph, fraction, solver="dp")
    assert plan.saved
    fc2s = {i for i, nd in enumerate(graph.nodes) if nd.module.endswith("mlp.fc2")}
    assert not fc2s & set(plan.saved)
    predicted = simulate(graph, plan).peak_bytes
    assert predicted <= plan.budget_bytes
    assert _measured(vit, plan) == predicted
