"""The fused head: an LM's output layer and its cross-entropy, gradients computed in the forward.

NOTE [ Fused head ]
    A chunked tail (NOTE [ Chunked head ] in ``solvers.model.chunks``) still
    runs autograd's head and loss per chunk: each chunk's logits, the
    cross-entropy's saved log-softmax and, in the backward, the loss's
    gradient and the logits' are logits-sized, and a head over fewer rows
    multiplies less efficiently (``benchmarks/results/time.md`` at
    ``45f0ca3``: a 256-row, 32,000-word Llama head in 2 chunks added 17.5 ms to
    a 227 ms CPU step and recomputed nothing, where transformers'
    checkpointing added 18.8 ms). When the head is a plain ``nn.Linear``
    (:func:`scheduler.tracing.chunk_loop.fusable`: no subclass, no hook, no
    parametrization), the runtime fuses it with its loss instead
    (``scheduler.tracing.chunk_loop.fused_head_loss``), as fused linear
    cross-entropy kernels do: for each of k row chunks, in the forward, it
    computes the logits, their log-softmax (upcast to fp32 for a causal
    model, as transformers' loss does), the chunk's loss, then turns the
    log-softmax into the loss's gradient in place (``exp``, minus one at the
    label) and multiplies it out: the input's gradient rows and the weight's
    (and bias's) gradient, added into one buffer with ``addmm_``. The chunk's
    logits are freed before the next; the backward multiplies the kept
    gradients by the loss's gradient (nothing when it is 1, as
    ``loss.backward()`` hands). A second backward, or one with
    ``create_graph`` (a gradient penalty), computes the gradients again from
    the saved input, written out in torch ops, so gradients of gradients are
    exact (``autograd.grad`` of a recomputed loss would follow the input's
    history back to a weight the head shares with the embedding, GPT-2's,
    and free the saved tensors of the layers on the way). The
    gradients agree with the plain step to rounding (about 1e-7 relative in
    fp32, as chunking's do), and k = 1 is a plan of its own: the head whole,
    fused, its memory below the plain step's and its time no more.

    Where the head call ends in the output layer but runs more before it (a
    masked LM's head: BERT's ``cls`` runs a dense layer, GELU and a layer
    norm before its decoder), that part runs as written, whole, and only the
    output layer is fused with the loss: the runtime hands the head's call
    the layer's input back (the layer's forward handing its input on) and
    checks that the head returns the layer's output unchanged.

    The model: :func:`fuse` replaces the nodes of the output layer's call
    and the loss that read the layer's input by two. The first, the fused
    forward, has no backward (a node's workspace is charged in its backward
    too, and this one's backward is a multiplication): its workspace is the
    head parameters' gradient, the input's, and the largest chunk's
    transients: the logits, the log-softmax in the dtype the loss computes
    in (sized by the cross-entropy's saved buffer), an fp32 copy where that
    is twice the logits' size (bf16 logits: then also a bf16 copy of the
    weight's gradient), and three row-sized buffers. The second is the loss
    autograd sees: it saves its input (the hidden states, as the head did)
    and the label count (an int64 scalar), and owns the input's gradient
    (``saved_bytes``: allocated in the forward, handed on in the backward,
    where the walk counts it once more). The head's parameters are no node's
    (``param_bytes`` 0): their gradients are alive from the fused forward,
    the step's last node but one, so the walk's unattributed gradients,
    allocated at the start of the backward, are them. A weight the head
    shares with the embedding (GPT-2, BERT) keeps the embedding's measured
    backward, which added two gradients out of place where the fused step
    adds one in place: over by up to the weight's size. Neither node is ever
    in a region (no plan recomputes them). The trace records which output
    layers can run so (``graphs.FUSED_HEADS_META``); the applier runs the
    tail fused exactly when the plan's graph did, and refuses a plan whose
    layer has since changed (a hook added): run unfused, its memory would
    not be the plan's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from graphs import FUSED_HEADS_META, HOLDS_OP, Graph, Node, Span, storage_unit

from .rows import _base, _products, call_rows, chunk_rows

__all__ = ["FUSED_OP", "fused_heads", "fused_layer", "fused_start", "is_fused", "fuse"]

#: The op of the node that stands for a fused head and loss.
FUSED_OP = "fused_linear_cross_entropy"


def fused_heads(meta: Mapping[str, Any]) -> frozenset[str] | None:
    """The head paths ``meta`` (a graph's or a plan's ``graph_meta``) records as fusable; None where the trace
    did not record them (a graph or plan from before NOTE [ Fused head ])."""
    heads = meta.get(FUSED_HEADS_META)
    return None if heads is None else frozenset(str(h) for h in heads)


def fused_layer(heads: frozenset[str] | None, head: str) -> str | None:
    """The fusable layer (of ``heads``, :func:`fused_heads`) the head call at ``head`` ends in: the head itself, or
    an output layer inside it (BERT's ``cls.predictions.decoder``); None when there is none."""
    return next((h for h in sorted(heads or ()) if h == head or h.startswith(head + ".") or not head), None)


def fused_start(graph: Graph, head: str, first: int) -> int | None:
    """Where the fused part of the tail whose head call at ``head`` starts at node ``first`` begins: the first node
    of its fusable layer's call (``first`` itself when the head is that layer); None when it does not run fused."""
    layer = fused_layer(fused_heads(graph.meta), head)
    if layer is None:
        return None
    return next((sp.first for sp in graph.spans if sp.module == layer and sp.first >= first), None)


def is_fused(graph: Graph, head: str) -> bool:
    """Whether the tail of ``graph`` with head ``head`` runs fused (NOTE [ Fused head ])."""
    layer = fused_layer(fused_heads(graph.meta), head)
    return layer is not None and any(sp.module == layer for sp in graph.spans)


def _part(value: int, rows: int, part: int, unit: int) -> int:
    share = value // rows * part + value % rows
    return -(-share // unit) * unit


def fuse(graph: Graph, first: int, last: int, k: int, chunked: list[int], shared: list[int]) -> Graph:
    """The graph whose tail ``first..last`` (the head's nodes ``chunked``, the labels' ``shared``: ``_split`` in
    ``solvers.model.chunks``) runs fused in ``k`` chunks (NOTE [ Fused head ])."""
    nodes, preds = graph.nodes, graph.preds
    inside = set(chunked)
    unit = storage_unit(graph.meta)
    rows = call_rows(graph, first, last)
    sizes = chunk_rows(rows, k) if rows else [1] * k
    total = rows or k
    work = [i for i in chunked if nodes[i].op != HOLDS_OP]
    entry = sorted({j for i in work for j in preds[i] if j < first})
    labels = sorted({j for i in work for j in preds[i] if j >= first and j not in inside})
    hidden = max(nodes[_base(graph, j)].out_bytes for j in entry)
    products = [i for i in work if _products(nodes[i])]
    logits = max((nodes[_base(graph, i)].out_bytes for i in products), default=0)
    loss_in = [j for j in preds[last] if j in inside]
    read = nodes[_base(graph, loss_in[0])].out_bytes if loss_in else logits
    # the log-softmax, in the dtype the loss computes in: the cross-entropy's saved buffer (fp32 under autocast
    # from bf16 logits, which the loss reads as they are); twice the logits' bytes or more: an fp32 copy too
    lsm = max(read, nodes[last].saved_bytes)
    upcast = lsm >= 2 * logits > 0
    params = sum(nodes[i].param_bytes for i in chunked)
    part = sizes[0]
    transient = _part(logits, total, part, unit) + _part(lsm, total, part, unit) * (2 if upcast else 1) \
        + 3 * _part(hidden, total, part, unit) + (params if upcast else 0)
    end = nodes[last]
    saved = -(-hidden // unit) * unit
    count = -(-8 // unit) * unit  # the label count (an int64 scalar) the backward keeps for a second run
    # two nodes: the fused forward, whose transients are its workspace and no backward (a node's workspace is
    # charged in its backward too), and the loss autograd sees, saving the input and owning its gradient
    work_node = Node(name=f"{end.name}@fused.forward", inputs=tuple(nodes[j].name for j in entry + labels),
                     out_bytes=end.out_bytes, workspace_bytes=params + transient + saved,
                     fwd_flops=sum(nodes[i].fwd_flops + nodes[i].bwd_flops for i in chunked), bwd_flops=0,
                     fwd_cost=sum(nodes[i].fwd_cost for i in chunked), op=FUSED_OP, module=end.module,
                     requires_grad=False, recomputable=False)
    node = Node(name=f"{end.name}@fused", inputs=tuple(nodes[j].name for j in entry) + (work_node.name,),
                out_bytes=end.out_bytes, saves_inputs=tuple(nodes[j].name for j in entry), saved_bytes=saved + count,
                fwd_flops=0, bwd_flops=0, fwd_cost=0, op=FUSED_OP, module=end.module,
                requires_grad=end.requires_grad, recomputable=False)
    out = list(nodes[:first]) + [nodes[i] for i in shared] + [work_node, node]
    delta = len(out) - (last + 1)
    spans = [sp for sp in graph.spans if sp.last < first]
    spans += [dataclasses.replace(sp, last=sp.last + delta) for sp in graph.spans
              if sp.first <= first and sp.last >= last and (sp.first, sp.last) != (first, last)]
    gone = {nodes[i].name for i in chunked} | {nodes[i].name for i in range(first, last + 1) if nodes[i].op == HOLDS_OP}
    outputs = tuple(node.name if name == end.name else name for name in graph.outputs
                    if name not in gone or name == end.name)
    return dataclasses.replace(graph, nodes=tuple(out), spans=tuple(sorted(spans, key=lambda s: (s.first, -s.last))),
                               outputs=outputs)
