"""Pipeline stages: where the graph is cut, and the graph each stage runs.

NOTE [ Balanced stages ]
    Stages begin at repeated blocks (``model.layers.8``; the first stage also
    runs what comes before the first block, the last one what comes after
    the last block: the embeddings, the head and the loss), as torchtitan
    and ``torch.distributed.pipelining``'s split points cut them. Without
    user-given starts the blocks are grouped so that the slowest stage,
    which sets the pipeline's pace, is as fast as it can be: the largest
    stage's forward and backward FLOPs are least over every way to cut the
    blocks into consecutive groups (a dynamic program over the cuts).

NOTE [ A stage's graph ]
    Stage ``s`` runs the nodes from its first block to the node before the
    next stage's first block. Every tensor made before it and read in it
    (the hidden states it receives; masks, rotary tables and other tensors
    every block reads) becomes a node of its own at the front of the stage's
    graph: no cost, never recomputed, with the producer's bytes and
    gradient flag, and saved by its first reader, so it is held from the
    stage's forward into its backward as ``torch.distributed.pipelining``
    holds a stage's inputs. What the stage sends on is what it makes and no
    later node of the stage reads: held to the end, like a model's output.
    The model's inputs (``input_bytes``) are held by the first stage and by
    the last, which gets the labels; the Python scalars the model's autograd
    nodes save (also in ``input_bytes``, NOTE [ Saved Python scalars ] in
    ``scheduler.tracing.costs``) go to the stage whose nodes save them
    (``meta["saved_scalars"]``; all of them to every stage of a graph
    without that count), once per micro-batch in flight (NOTE [ What a
    rank holds ] in ``scheduler.distributed.ranks``); the stage's parameters are those its
    nodes use (a weight tied across stages, such as GPT-2's embedding and
    head, counts on the stage that uses it first). Spans inside the stage
    keep their module paths, so a stage's plan applies onto the stage's
    module as long as it keeps the model's paths (a copy of the model with
    the other stages' layers deleted, as torchtitan builds stages). Frozen
    parameters (a base under adapters) go to the stage whose nodes use
    them first (``meta["frozen_params"]``; all of them to every stage of a
    graph without that count), trained ones to the node whose backward
    makes their gradient, as in the whole graph. The
    parameter count is not checked on a stage's plan: a tied weight makes
    it differ.

    ``torch.distributed.pipelining``'s ``PipelineStage`` holds more, for
    the whole step (:func:`pipeline_buffer_bytes`, added to the stage's
    inputs): a receive buffer per micro-batch for what it receives (the
    activations it runs on are those buffers, so only the micro-batches not
    in flight add to the graph's count) and one per micro-batch for the
    gradient of what it sends; the caller's whole batch on the first and
    last stages; and on the last stage, the module's output (the logits the
    schedule's ``loss_fn`` reads, kept until that micro-batch's backward) of
    each micro-batch in flight: the tensors the graph's last node, the loss,
    reads and does not save, unless the graph holds them already (an
    output of the user's held loop, NOTE [ The user's loop ]). (Measured on gloo, 2 and 4 stages of a 4-layer
    decoder, 4 micro-batches: without these the prediction of the last stage
    was 67,592 bytes under its allocator peak.)
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from graphs import FROZEN_META, HOLDS_OP, SCALARS_META, Graph, Node, Span

from .fsdp import repeated_blocks
from .layout import Layout, LayoutError

__all__ = ["stage_bounds", "stage_starts", "stage_graph", "pipeline_buffer_bytes", "saved_scalar_bytes",
           "stage_scalar_bytes", "STAGE_META"]

#: ``meta`` key of a stage's graph: ``{"index", "stages", "first", "last", "inputs"}``.
STAGE_META = "stage"


def _block_starts(graph: Graph, blocks: Sequence[str]) -> list[int]:
    first = {sp.module: sp.first for sp in graph.spans}
    return [first[b] for b in blocks]


def stage_bounds(graph: Graph, layout: Layout) -> tuple[tuple[int, int], ...]:
    """``(first, last)`` node positions of each stage, in order (NOTE [ Balanced stages ]).

    Raises:
        LayoutError: a stage start that is no submodule call of the graph, starts out of order, or fewer
            repeated blocks than stages.
    """
    n_stages = layout.stages
    if n_stages == 1:
        return ((0, len(graph.nodes) - 1),)
    if layout.stage_starts:
        firsts = {}
        for sp in graph.spans:
            firsts.setdefault(sp.module, sp.first)
        starts = []
        for name in layout.stage_starts:
            if name not in firsts:
                raise LayoutError(f"stage start {name!r} is no submodule call of the graph; name the module a stage "
                                  "begins at, e.g. model.layers.8 (ckpt solve prints the graph's module paths)")
            starts.append(firsts[name])
        if any(b <= a for a, b in zip([0] + starts, starts)):
            raise LayoutError(f"stage starts {', '.join(layout.stage_starts)} are not in the model's order, or the "
                              "first is at the model's first node; list the modules where stages 1, 2, ... begin")
    else:
        starts = _balanced_starts(graph, n_stages)
    cuts = [0] + starts + [len(graph.nodes)]
    return tuple((cuts[k], cuts[k + 1] - 1) for k in range(n_stages))


def stage_starts(graph: Graph, layout: Layout) -> tuple[str, ...]:
    """The module paths stages 1, 2, ... begin at (the user's, or the balanced ones): the outermost submodule
    call starting at each stage's first node."""
    if layout.stage_starts:
        return layout.stage_starts
    firsts = [a for a, _ in stage_bounds(graph, layout)][1:]
    outer = {}
    for sp in graph.spans:  # sorted by (first, -last): the outermost call at a position comes first
        outer.setdefault(sp.first, sp.module)
    return tuple(outer[a] for a in firsts)


def _balanced_starts(graph: Graph, n_stages: int) -> list[int]:
    blocks = repeated_blocks(graph)
    if len(blocks) < n_stages:
        raise LayoutError(f"{n_stages} pipeline stages need at least {n_stages} repeated blocks to cut at, and the "
                          f"graph has {len(blocks)}; give the stage starts (--stages) or fewer stages")
    starts = _block_starts(graph, blocks)
    step = [nd.fwd_flops + (nd.bwd_flops if nd.requires_grad else 0) for nd in graph.nodes]
    prefix = [0]
    for f in step:
        prefix.append(prefix[-1] + f)
    # pieces between candidate cuts: piece p runs from cut[p] to cut[p + 1] (block starts; the ends of the graph)
    cut = [0] + starts[1:] + [len(graph.nodes)]
    piece = [prefix[cut[p + 1]] - prefix[cut[p]] for p in range(len(cut) - 1)]
    n = len(piece)
    inf = float("inf")
    # best[k][p]: least max-stage cost covering pieces [0, p) with k stages; choice[k][p]: where the last stage starts
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    choice = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for p in range(k, n + 1):
            total = 0
            for q in range(p - 1, k - 2, -1):
                total += piece[q]
                value = max(best[k - 1][q], total)
                if value < best[k][p]:
                    best[k][p], choice[k][p] = value, q
    bounds, p = [], n
    for k in range(n_stages, 0, -1):
        q = choice[k][p]
        bounds.append(q)
        p = q
    return [cut[q] for q in sorted(bounds)[1:]]


def stage_graph(graph: Graph, first: int, last: int, *, index: int = 0, stages: int = 1) -> Graph:
    """The graph stage ``index`` runs: nodes ``first..last`` and what they receive (NOTE [ A stage's graph ])."""
    if first == 0 and last == len(graph.nodes) - 1:
        return graph
    # a hold of a tensor the stage receives: the pipeline's buffers hold that; holds after the stage's last call
    # end with it (its last node is what it sends, whose gradient it receives) (NOTE [ Forward holds ])
    while last > first and graph.nodes[last].op == HOLDS_OP:
        last -= 1
    mine = {nd.name for nd in graph.nodes[first:last + 1]}
    graph = dataclasses.replace(graph, nodes=graph.nodes[:first] + tuple(
        dataclasses.replace(nd, inputs=tuple(x for x in nd.inputs if x in mine), saves_inputs=())
        if nd.op == HOLDS_OP and any(x not in mine for x in nd.inputs) else nd
        for nd in graph.nodes[first:last + 1]) + graph.nodes[last + 1:])
    preds = graph.preds
    crossing = sorted({j for i in range(first, last + 1) for j in preds[i] if j < first})
    saver = {}
    for j in crossing:
        saver[j] = next((i for i in range(first, last + 1) if j in preds[i]), None)
    nodes: list[Node] = []
    for j in crossing:
        nd = graph.nodes[j]
        nodes.append(Node(name=nd.name, out_bytes=nd.out_bytes, requires_grad=nd.requires_grad, recomputable=False,
                          op="stage_input", module=""))
    held = {saver[j]: [] for j in crossing}
    for j in crossing:
        if not any(graph.nodes[j].name in graph.nodes[i].saves_inputs for i in range(first, last + 1)):
            held[saver[j]].append(graph.nodes[j].name)
    for i in range(first, last + 1):
        nd = graph.nodes[i]
        if held.get(i):
            nd = dataclasses.replace(nd, saves_inputs=tuple(nd.saves_inputs) + tuple(held[i]))
        nodes.append(nd)
    shift = len(crossing) - first
    spans = [Span(sp.first + shift, sp.last + shift, sp.module, sp.extra_bytes) for sp in graph.spans
             if first <= sp.first and sp.last <= last]
    frozen = stage_frozen_bytes(graph, first, last)
    params = sum(nd.param_bytes for nd in graph.nodes[first:last + 1]) + frozen
    if first == 0:  # the trained parameters no node is given
        params += graph.unattributed_grad_bytes()
    meta = {k: v for k, v in graph.meta.items() if k != "parameters"}
    meta[STAGE_META] = {"index": index, "stages": stages, "first": graph.nodes[first].name,
                        "last": graph.nodes[last].name, "inputs": [graph.nodes[j].name for j in crossing]}
    total, scalars = saved_scalar_bytes(graph), stage_scalar_bytes(graph, first, last)
    if total:  # NOTE [ A stage's graph ]: the scalars its own nodes save, not the model's
        meta["saved_scalar_bytes"] = scalars
        meta[SCALARS_META] = {k: v for k, v in dict(graph.meta.get(SCALARS_META) or {}).items()
                              if k in {nd.name for nd in graph.nodes[first:last + 1]}}
    inputs = (graph.input_bytes - total if first == 0 or last == len(graph.nodes) - 1 else 0) + scalars
    fields = {f.name for f in dataclasses.fields(graph)}
    extra = {}
    if "outputs" in fields:  # the user's loop (NOTE [ The user's loop ]): outputs of this stage only
        mine = {graph.nodes[i].name for i in range(first, last + 1)}
        extra["outputs"] = tuple(o for o in getattr(graph, "outputs") if o in mine)
    return dataclasses.replace(graph, nodes=tuple(nodes), param_bytes=params, frozen_param_bytes=frozen,
                               input_bytes=inputs, spans=tuple(spans), meta=meta, name=f"{graph.name} stage {index}",
                               **extra)


def stage_frozen_bytes(graph: Graph, first: int, last: int) -> int:
    """The frozen parameters of nodes ``first..last`` of ``graph`` (NOTE [ A stage's graph ]): those its nodes
    use first (``meta["frozen_params"]``), and on the first stage those no node uses; for a graph without that
    count (saved by an older version), all of them on every stage."""
    total = graph.frozen_param_bytes
    per_node = graph.meta.get(FROZEN_META)
    if not total or not isinstance(per_node, dict):
        return total
    names = {nd.name for nd in graph.nodes}
    unplaced = max(0, total - sum(int(v) for k, v in per_node.items() if k in names))
    return (unplaced if first == 0 else 0) + sum(int(per_node.get(nd.name, 0)) for nd in graph.nodes[first:last + 1])


def saved_scalar_bytes(graph: Graph) -> int:
    """The Python scalars ``graph``'s autograd nodes save (NOTE [ Saved Python scalars ] in
    ``scheduler.tracing.costs``): in its ``input_bytes``, held by each micro-batch from its forward to its
    backward."""
    return int(graph.meta.get("saved_scalar_bytes", 0) or 0)


def stage_scalar_bytes(graph: Graph, first: int, last: int) -> int:
    """The saved Python scalars of nodes ``first..last`` of ``graph`` (NOTE [ A stage's graph ]): from the
    trace's per-node count, or, for a graph that has none (saved by an older version), all of them."""
    total = saved_scalar_bytes(graph)
    per_node = graph.meta.get(SCALARS_META)
    if not total or not isinstance(per_node, dict):
        return total
    names = {nd.name for nd in graph.nodes}
    unplaced = total - sum(int(v) for k, v in per_node.items() if k in names)  # charged to every stage
    return max(0, unplaced) + sum(int(per_node.get(nd.name, 0)) for nd in graph.nodes[first:last + 1])


def pipeline_buffer_bytes(graph: Graph, microbatches: int, inflight: int) -> int:
    """What a stage's rank holds for the pipeline beyond its graph's count (NOTE [ A stage's graph ]):
    the receive buffers of the micro-batches not in flight, those of the gradients it is sent back, the
    model inputs of the other micro-batches, and on the last stage the output each micro-batch in flight
    hands its loss."""
    meta = graph.meta.get(STAGE_META) or {}
    if not meta or meta.get("stages", 1) == 1:
        return 0
    received = sum(nd.out_bytes for nd in graph.nodes if nd.op == "stage_input")
    last = graph.nodes[-1]
    is_last = meta["index"] == meta["stages"] - 1
    sent_back = last.out_bytes if not is_last and last.requires_grad else 0
    output = 0
    if is_last:  # what the stage's module returns, unless the graph holds it already (the user's held loop)
        index, held = graph.index, {graph.nodes[i].name for i in graph.held_outputs()}
        output = sum(graph.nodes[index[name]].out_bytes for name in dict.fromkeys(last.inputs)
                     if graph.nodes[index[name]].requires_grad and name not in last.saves_inputs
                     and name not in held)
    inputs = graph.input_bytes - saved_scalar_bytes(graph)  # the scalars are each micro-batch's, while in flight
    return ((microbatches - inflight) * received + microbatches * sent_back + (microbatches - 1) * inputs
            + inflight * output)
