"""Chunked regions: the LM head and its loss run over k row chunks, each chunk its own checkpoint region.

NOTE [ Chunked head ]
    On a language model the logits (tokens x vocabulary, fp32 for the loss)
    and the cross-entropy's saved log-softmax are the largest tensors of the
    step, and no interval plan can shrink them: a region around the head
    still recomputes all of them at once in the backward. A chunked head
    runs the head call and the loss over k equal chunks of the token rows
    (batch x sequence flattened), each chunk one non-reentrant checkpoint
    region, so one chunk's logits are alive at a time in the forward and in
    the backward. The loss is the sum of the chunks' summed token losses
    divided by the count of tokens whose label is not ``-100`` (what
    transformers' mean over non-ignored tokens is, reassociated: the loss
    and the head's weight gradient agree with the plain step to rounding,
    about 1e-7 relative; every other gradient is computed by the same
    per-row formula).

    The model: the traced graph's *tail* is the head's call (the outermost
    submodule call that produces the logits, :func:`find_tail`) and every
    node after it up to the loss, the graph's last node. Its nodes that do
    not depend on the head (the labels' shift) are *shared*; the others are
    *chunked*. ``chunked_graph(graph, first, k)`` is the graph the plan runs:
    the nodes before the tail, the shared nodes once, then k copies of the
    chunked nodes (each a span named ``HEAD@chunk{c}/{k}``, so a plan may
    checkpoint each chunk or not), then one node summing the k losses. A
    copy carries ``b // k + b % k`` of each of its node's bytes and FLOPs
    (exact when k divides the rows: the remainder is what does not scale,
    the 4-byte loss and the 4-byte total weight the loss saves). The head's
    parameter gradient is created by the backward of the last chunk (the
    first to run); each earlier chunk's backward computes its own (a
    transient of the same size) and autograd adds it into the first. The
    first of those additions is out of place (the first gradient is the
    transposed view ``mm`` hands ``linear``'s weight, which autograd's
    input buffer does not add into: measured on torch 2.13), so chunk
    ``k - 2`` holds two transients and the earlier ones one. That transient
    is the copy's ``workspace_bytes``, so its forward step is charged it
    too (an over-estimate there only).

    Plans are solved on the chunked graph with every solver unchanged:
    ``Plan.chunks`` lists ``(first, k)`` and the plan's regions and kept
    nodes are positions of :func:`expand` ``(graph, plan.chunks)``, which
    ``simulate``, ``Plan.validate`` and the brute force read. The exact
    solvers choose k by solving once per k of a menu (:func:`solve_chunked`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from graphs import Graph, Node, Span

from .errors import InfeasibleBudget, SolverInputError

__all__ = ["CHUNK_MENU", "ChunkError", "Tail", "find_tail", "chunked_graph", "expand", "chunk_module",
           "parse_chunk_module", "solve_chunked"]

log = logging.getLogger(__name__)

#: The chunk counts the solvers try (1: the head as traced).
CHUNK_MENU = (1, 2, 4, 8, 16)

#: ATen ops that compute each token row from that row alone (with parameters and label rows).
ROWWISE_OPS = frozenset({
    "aten.linear.default", "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.alias.default", "aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default",
    "aten.contiguous.default", "aten.clone.default", "aten._assert_tensor_metadata.default",
    "aten.gelu.default", "aten.relu.default", "aten.silu.default", "aten.tanh.default",
    "aten.layer_norm.default", "aten.native_layer_norm.default", "aten.rms_norm.default",
    "aten.add.Tensor", "aten.mul.Tensor", "aten.cross_entropy_loss.default",
})
#: The losses a chunked tail may end in (the sum over chunks is the loss of the whole).
LOSS_OPS = frozenset({"aten.cross_entropy_loss.default"})
_CHUNK_TAG = "@chunk"


class ChunkError(SolverInputError):
    """The graph has no tail that chunking can run (the message names the node and why)."""


@dataclass(frozen=True)
class Tail:
    """The chunkable tail of a graph (NOTE [ Chunked head ]).

    Attributes:
        first: position of the head call's first node; the tail is ``first..len(graph)-1``.
        head: module path of the head call (``lm_head``, ``cls``).
        chunked: tail positions that depend on the head (copied per chunk).
        shared: tail positions that do not (the labels' preparation), run once.
    """

    first: int
    head: str
    chunked: tuple[int, ...]
    shared: tuple[int, ...]


def find_tail(graph: Graph) -> Tail:
    """The head call and loss at the end of ``graph``, checked row-independent.

    Raises:
        ChunkError: the last node is no cross-entropy, no submodule call
            produces its logits, or a node of the tail is no row-wise op or
            reads a tensor from before the head other than the head's input.
    """
    return graph.cached("_chunk_tail", lambda: _find_tail(graph))


def _find_tail(graph: Graph) -> Tail:
    n, nodes, preds = len(graph), graph.nodes, graph.preds
    if n < 2 or nodes[-1].op not in LOSS_OPS:
        last = nodes[-1].name if n else "none"
        raise ChunkError(f"the graph ends in {last!r} ({nodes[-1].op if n else 'empty'}), not in a cross-entropy "
                         "loss: only a head whose loss the traced step computes can be chunked (trace with the labels)")
    logits = preds[n - 1][0] if preds[n - 1] else -1
    while logits >= 0 and nodes[logits].out_bytes == 0 and preds[logits]:
        logits = preds[logits][0]  # through views and casts
    heads = [sp for sp in graph.spans if sp.first <= logits <= sp.last and sp.last < n - 1]
    if logits < 0 or not heads:
        raise ChunkError(f"no submodule call produces the logits the loss {nodes[-1].name!r} reads: a chunked head "
                         "is one submodule call (trace the model itself, so the graph records its calls)")
    head = min(heads, key=lambda sp: (sp.first, -sp.last))
    chunked, shared = [], []
    inside = [False] * n
    for i in range(head.first, n):
        inside[i] = i <= head.last or any(inside[j] for j in preds[i])
        (chunked if inside[i] else shared).append(i)
    entry = set(preds[head.first])
    for i in chunked:
        nd = nodes[i]
        if nd.op not in ROWWISE_OPS:
            raise ChunkError(f"node {nd.name!r} ({nd.op}) of the head {head.module!r} and its loss is not known to "
                             "compute each token row alone, so the head cannot run in chunks")
        if nd.stochastic or nd.stateful:
            raise ChunkError(f"node {nd.name!r} of the head {head.module!r} draws random numbers or updates state; "
                             "chunks would draw or update differently than the whole")
        for j in preds[i]:
            if j < head.first and j not in entry:
                raise ChunkError(f"node {nd.name!r} of the head {head.module!r} reads {nodes[j].name!r} from before "
                                 "the head besides its input; chunking would have to split that tensor too")
            if j >= head.first and not inside[j] and nd.op not in LOSS_OPS:
                raise ChunkError(f"node {nd.name!r} reads the label tensor {nodes[j].name!r}; only the loss may")
    return Tail(first=head.first, head=head.module, chunked=tuple(chunked), shared=tuple(shared))


def chunk_module(head: str, c: int, k: int) -> str:
    """The span name of chunk ``c`` of ``k`` of the head call ``head``."""
    return f"{head}{_CHUNK_TAG}{c}/{k}"


def parse_chunk_module(path: str) -> tuple[str, int, int] | None:
    """``(head, c, k)`` of a chunk's span name, or None for any other path."""
    head, tag, rest = path.rpartition(_CHUNK_TAG)
    if not tag or "/" not in rest:
        return None
    c, _, k = rest.partition("/")
    return (head, int(c), int(k)) if c.isdigit() and k.isdigit() else None


def _part(value: int, k: int) -> int:
    return value // k + value % k  # NOTE [ Chunked head ]: the remainder is what does not scale


def chunked_graph(graph: Graph, first: int, k: int) -> Graph:
    """The graph a plan with the tail at ``first`` in ``k`` chunks runs (NOTE [ Chunked head ]).

    Raises:
        ChunkError: ``first`` is not where :func:`find_tail` puts the tail, or ``k < 2``.
    """
    tail = find_tail(graph)
    if first != tail.first:
        raise ChunkError(f"a chunked tail starts at node {first}, but the head {tail.head!r} of this graph starts at "
                         f"node {tail.first}; solve again")
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ChunkError(f"a chunked tail runs in k >= 2 chunks, got k={k!r}")
    return graph.cached(f"_chunked_{k}", lambda: _build(graph, tail, k))


def _build(graph: Graph, tail: Tail, k: int) -> Graph:
    nodes = graph.nodes
    out: list[Node] = list(nodes[:tail.first]) + [nodes[i] for i in tail.shared]
    spans = [sp for sp in graph.spans if sp.last < tail.first]
    name_of = [nd.name for nd in nodes]
    losses = []
    for c in range(k):
        rename = {name_of[i]: f"{name_of[i]}@{c}" for i in tail.chunked}
        start = len(out)
        for i in tail.chunked:
            nd = nodes[i]
            extra = nd.param_bytes * (2 if c == k - 2 else 1 if c < k - 2 else 0)  # NOTE [ Chunked head ]
            out.append(dataclasses.replace(
                nd, name=rename[nd.name], inputs=tuple(rename.get(x, x) for x in nd.inputs),
                saves_inputs=tuple(rename.get(x, x) for x in nd.saves_inputs), out_bytes=_part(nd.out_bytes, k),
                saved_bytes=_part(nd.saved_bytes, k), workspace_bytes=_part(nd.workspace_bytes, k) + extra,
                param_bytes=nd.param_bytes if c == k - 1 else 0, fwd_flops=_part(nd.fwd_flops, k),
                bwd_flops=_part(nd.bwd_flops, k), fwd_cost=_part(nd.fwd_cost, k), members=()))
        spans.append(Span(start, len(out) - 1, chunk_module(tail.head, c, k)))
        losses.append(out[-1].name)
    loss = nodes[-1]
    out.append(Node(name=f"{loss.name}@sum", inputs=tuple(losses), out_bytes=loss.out_bytes,
                    workspace_bytes=loss.out_bytes, fwd_flops=k, bwd_flops=0, op="aten.add.Tensor",
                    saves_inputs=(), module=loss.module))
    meta = {**graph.meta, "chunks": {"head": tail.head, "first": tail.first, "k": k}}
    return dataclasses.replace(graph, nodes=tuple(out), spans=tuple(spans), meta=meta)


def expand(graph: Graph, chunks: Sequence[tuple[int, int]]) -> Graph:
    """The graph a plan with ``chunks`` (``Plan.chunks``) runs: ``graph`` itself when there are none."""
    if not chunks:
        return graph
    if len(chunks) > 1:
        raise ChunkError(f"a plan chunks one tail (the head and its loss), got {len(chunks)} chunk entries")
    first, k = chunks[0]
    return chunked_graph(graph, first, k)


def solve_chunked(graph: Graph, budget_bytes: int, solve_one: Callable[[Graph, int], Any],
                  menu: Sequence[int] = CHUNK_MENU) -> Any:
    """The cheapest plan over every chunk count in ``menu`` (NOTE [ Chunked head ]).

    ``solve_one(g, budget_bytes)`` solves one graph (a registered solver
    through ``solvers.solve``); each k >= 2 is solved on
    :func:`chunked_graph`, and the plan with the least recompute cost that
    fits wins (ties: fewer chunks). With an exact ``solve_one`` the answer is
    optimal over the menu's chunkings of the tail and every interval plan.

    Raises:
        ChunkError: ``menu`` asks for chunks and the graph has no chunkable tail.
        InfeasibleBudget: no k fits; its least feasible budget is the least over the menu.
    """
    ks = sorted(set(int(k) for k in menu))
    if not ks or ks[0] < 1:
        raise ChunkError(f"chunk counts are integers >= 1, got {list(menu)!r}")
    tail = find_tail(graph) if ks[-1] > 1 else None
    best, failures = None, []
    for k in ks:
        g = graph if k == 1 else chunked_graph(graph, tail.first, k)
        try:
            plan = solve_one(g, budget_bytes)
        except InfeasibleBudget as exc:
            failures.append(exc if k == 1 else exc.replace(best_regions=None))  # those are chunked-graph positions
            continue
        if k > 1:
            plan = dataclasses.replace(plan, chunks=((tail.first, k),), fingerprint=graph.fingerprint(),
                                       graph_meta=graph.meta, findings={**plan.findings, "chunks": k, "chunk_head": tail.head})
        if best is None or plan.recompute_cost < best.recompute_cost:
            best = plan
        log.info("chunks %d: recompute %d", k, plan.recompute_cost)
    if best is None:
        raise min(failures, key=lambda e: e.min_feasible_bytes)
    return best
