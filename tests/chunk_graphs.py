"""A tiny language model graph with a chunkable head and MLP blocks (NOTE [ Chunked head ] in solvers.model.chunks),
small enough for brute force on its chunked graphs."""

from __future__ import annotations

import random

from graphs import Graph, Node, Span


def lm_graph(seed: int = 0, *, blocks: int = 1, vocab_x: int = 8, tail_op: str = "", upcast: bool = False) -> Graph:
    """A tiny language model: blocks, a head (linear, then ``tail_op`` if given) over vocab_x times the hidden
    bytes, labels, CE; small enough for brute force on its chunked graphs (13-14 nodes at k = 4 / k = 2)."""
    rng = random.Random(seed)
    h = 256 * rng.randint(2, 6)
    nodes = [Node("emb", out_bytes=h, fwd_flops=h, param_bytes=4 * h, op="aten.embedding.default", saves_inputs=())]
    spans = [Span(0, 0, "emb")]
    prev = "emb"
    for b in range(blocks):
        w = h * rng.randint(1, 4)
        nodes += [Node(f"fc{b}", inputs=(prev,), out_bytes=w, fwd_flops=rng.randint(5, 50) * w,
                       op="aten.linear.default", param_bytes=w),
                  Node(f"act{b}", inputs=(f"fc{b}",), out_bytes=w, fwd_flops=w, saves_inputs=(f"fc{b}",),
                       op="aten.gelu.default"),
                  Node(f"out{b}", inputs=(f"act{b}",), out_bytes=h, fwd_flops=rng.randint(5, 50) * w,
                       op="aten.linear.default", param_bytes=w)]
        spans.append(Span(len(nodes) - 3, len(nodes) - 1, f"block{b}"))
        prev = f"out{b}"
    v = vocab_x * h
    nodes.append(Node("head", inputs=(prev,), out_bytes=v, fwd_flops=100 * v, param_bytes=v // 8,
                      op="aten.linear.default"))
    if tail_op:
        nodes.append(Node("head_act", inputs=("head",), out_bytes=v, fwd_flops=v, saves_inputs=("head",), op=tail_op))
    spans.append(Span(len(nodes) - 1 - bool(tail_op), len(nodes) - 1, "lm_head"))
    if upcast:  # a bf16 model's logits, cast to fp32 for the loss outside the head
        nodes.append(Node("upcast", inputs=(nodes[-1].name,), out_bytes=2 * v, fwd_flops=v, saves_inputs=(),
                          op="aten.to.dtype"))
    nodes += [Node("labels", out_bytes=64, op="aten.contiguous.default", requires_grad=False),
              Node("loss", inputs=(nodes[-1].name, "labels"), out_bytes=4, saved_bytes=v + 4, workspace_bytes=v,
                   fwd_flops=2 * v, saves_inputs=("labels",), op="aten.cross_entropy_loss.default")]
    return Graph(nodes=tuple(nodes), param_bytes=sum(nd.param_bytes for nd in nodes), input_bytes=128,
                 name=f"lm{seed}", spans=tuple(spans))
