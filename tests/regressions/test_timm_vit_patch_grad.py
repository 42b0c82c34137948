"""A ``cat``'s gradient handed on through views stays alive through their owner's backward.

timm's ``vit_base_patch16_224`` (``img_size=128``, batch 8), store-all: the
prediction was 24,576 bytes (one ``[8, 768]`` row) below the allocator's peak,
at the patch convolution's backward. Its output goes
``flatten(2).transpose(1, 2)`` and into ``torch.cat`` after the class token;
``cat``'s backward hands out views of its ``[8, 65, 768]`` gradient, the two
views' backward hand them on, and the convolution's backward reads the
``[8, 64, 768]`` view, so the whole ``[8, 65, 768]`` lives through it, where
``simulate`` held a ``[8, 768, 8, 8]`` of the convolution's own (NOTE [ View
gradients through views ] in ``solvers.model.gradients``). Reproduced on a
timm-like ViT (``tests/timm_like.py``) whose store-all peak is that step.
"""

import dataclasses

import torch

from graphs import Graph, Node
from scheduler.measuring.storages import measure_step
from scheduler.tracing.tracer import capture
from solvers import simulate
from solvers.model.gradients import GradientWalk
from timm_like import vit_example


def _patch_embedding(views_hand_on: bool) -> Graph:
    # conv (16 bytes) -> flatten -> transpose (views) -> cat with a class row (20 bytes) -> head (4)
    return Graph(nodes=(
        Node("conv", out_bytes=16, fwd_flops=1, saves_inputs=()),
        Node("flatten", inputs=("conv",), out_bytes=0, fwd_flops=0, saves_inputs=(), grad_views=views_hand_on),
        Node("transpose", inputs=("conv", "flatten"), out_bytes=0, fwd_flops=0, saves_inputs=(),
             grad_views=views_hand_on),
        Node("cat", inputs=("conv", "transpose"), out_bytes=20, fwd_flops=1, saves_inputs=(), grad_views=True),
        Node("head", inputs=("cat",), out_bytes=4, fwd_flops=1),
    ))


def _gradient_bytes_at(graph: Graph, name: str) -> int:
    walk = GradientWalk(graph)
    walk.start()
    for i in range(len(graph) - 1, -1, -1):
        walk.node_backward(i)
        if graph.nodes[i].name == name:
            return walk.bytes
        walk.node_done(i)
    raise AssertionError(name)


def test_the_cat_gradient_lives_through_the_convolutions_backward():
    # By hand: head's backward makes cat's gradient (20; the seed, 4, stays with the caller); cat hands
    # views of it to transpose and, through it, to conv; transpose hands one to flatten, and neither
    # view adds a contribution of its own. At conv's backward: 4 + 20.
    assert _gradient_bytes_at(_patch_embedding(True), "conv") == 24
    # Views that hand on nothing (the graph before): transpose "adds" into conv's view, which becomes a
    # new 16-byte tensor, and the cat's 20 go at transpose's backward: 4 bytes (the class row) too few.
    assert _gradient_bytes_at(_patch_embedding(False), "conv") == 20


def test_vit_store_all_peak_at_the_patch_convolution_is_exact():
    model, x, _, loss = vit_example(batch=2, image=32, dim=128, depth=1)
    graph = capture(model, (x,), loss=loss, workspaces="none", costs="flops").graph
    views = {nd.name for nd in graph.nodes if nd.module == "patch_embed" and nd.out_bytes == 0}
    assert views == {"flatten", "transpose"} and all(graph.nodes[graph.index[v]].grad_views for v in views)
    sim = simulate(graph)
    assert graph.nodes[graph.index[sim.peak_node]].module == "patch_embed.proj" and sim.peak_phase == "backward"
    torch.manual_seed(0)
    assert measure_step(model, (x,), loss=loss).peak_bytes == sim.peak_bytes
    before = dataclasses.replace(graph, nodes=tuple(dataclasses.replace(nd, grad_views=nd.grad_views and nd.out_bytes > 0)
                                                    for nd in graph.nodes))
    row = 2 * 128 * 4  # the class token's row of the [2, 17, 128] gradient
    assert simulate(before).peak_bytes == sim.peak_bytes - row
