"""A region's BatchNorm buffers, copied while it recomputes, are in the prediction.

The applier snapshots a stateful region's buffers around its recompute (NOTE
[ Stateful ops under recompute ] in ``scheduler.applying.modules``). The tracer records
them as ``Node.state_bytes`` (all of a BatchNorm's buffers: ``native_batch_norm``
updates the running statistics without declaring the write), and ``simulate``
and the DP/ILP models count them for the recompute's duration: a ResNet region
over the stem and the first bottleneck measured 744 bytes above its prediction.
"""

import torch

from graphs import Graph, Node
from scheduler.applying.graph import CheckpointedModule, cut
from scheduler.comparing.workloads import workload
from scheduler.measuring.storages import measure_step
from scheduler.tracing.tracer import capture
from solvers import Plan, simulate


def test_state_bytes_live_for_the_recompute_only():
    g = Graph(nodes=(
        Node("a", out_bytes=10, fwd_flops=1),
        Node("bn", inputs=("a",), out_bytes=10, fwd_flops=1, stateful=True, state_bytes=7),
        Node("c", inputs=("bn",), out_bytes=10, fwd_flops=1),
    ))
    plain = simulate(g, Plan(regions=((0, 1),)))
    free = simulate(Graph(nodes=tuple(Node(**{**nd.to_dict(), "state_bytes": 0}) for nd in g.nodes)),
                    Plan(regions=((0, 1),)))
    diff = [x - y for x, y in zip(plain.live_bytes, free.live_bytes)]
    phases = [ph for ph, _ in plain.steps]
    assert diff == [7 if ph == "recompute" else 0 for ph in phases]
    assert phases.count("recompute") == 2


def test_resnet_region_with_batchnorms_measures_as_predicted():
    torch.manual_seed(0)
    wl = workload("resnet", quick=True)
    with torch.random.fork_rng():  # one trace for the graph and the applied module (apply traces again)
        traced = capture(wl.model, wl.args, dict(wl.kwargs), loss=wl.trace_loss, workspaces="none")
    g = traced.graph
    end = next(sp.last for sp in g.spans if sp.module == "layers.0")  # the stem and the first block
    assert end >= 13
    bns = [nd for nd in g.nodes[1:end + 1] if nd.stateful]
    buffers = sum(b.numel() * b.element_size() for n, b in wl.model.named_buffers()
                  if n.startswith(("stem.", "layers.0.")))
    assert len(bns) == 5 and sum(nd.state_bytes for nd in bns) == buffers
    plan = Plan.from_regions(g, [(1, end)])
    split, regions = cut(traced, plan)
    applied = CheckpointedModule(wl.model, split, traced, plan, regions)
    torch.manual_seed(0)
    measured = measure_step(wl.model, wl.args, wl.kwargs, run=applied).peak_bytes
    assert measured == simulate(g.unaligned(), plan, record=False).peak_bytes  # the fx graph runs: no holds
