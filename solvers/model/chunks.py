"""Chunked regions: a call run over k row chunks, each chunk its own checkpoint region.

NOTE [ Chunked head ]
    On a language model the logits (tokens x vocabulary, fp32 for the loss)
    and the cross-entropy's saved log-softmax are the largest tensors of the
    step, and no interval plan can shrink them: a region around the head
    still recomputes all of them at once in the backward. A chunked call
    runs a submodule call over k equal chunks of the token rows (batch x
    sequence flattened), each chunk one non-reentrant checkpoint region (or
    not, as the plan says), so one chunk's intermediates are alive at a time.
    Two kinds (:func:`find_tail`, :func:`find_calls`):

    * the *tail*: the head call (the outermost call producing the logits)
      together with the loss, the graph's last node (a cross-entropy). The
      loss is the sum of the chunks' summed token losses divided by the count
      of tokens whose label is not ``-100``: transformers' mean over
      non-ignored tokens, reassociated;
    * a *row-wise call* (an MLP): a call of two matrix products or more
      whose every node computes each row from that row alone, reading one
      tensor from before it and read after it only through its last node;
      the chunks' outputs are concatenated. It returns that one tensor: a
      body returning ``(hidden, caches)`` shows the graph one tensor, and
      ``apply`` cannot join its chunks (``ChunkedHeadError`` at step one:
      the generator's s20, s67, s93). The trace records calls returning
      anything else (``meta["call_returns"]``; not on ``meta`` models), and
      :func:`find_calls` offers the calls inside them instead.

    Between the head call and the loss only views and casts may run (the
    loss's own upcast): a model that changes its logits after the head
    (Gemma 2's soft-capping: div, tanh, mul) has no tail, so a menu skips its
    head and says why; ``apply`` refused such a plan at its first step.

    Row independence is read from the traced graph: every op is one of
    :data:`ROWWISE_OPS` (views are taken to keep the token dimension leading,
    as the calls transformers writes do), none draws random numbers or
    updates state, and a matrix product reads one tensor (up to views) of the
    call, its other operand a parameter. A node that groups several ops (a
    coarser granularity: ``auto`` folds a full-size model's MLP into one node)
    is read by the ops it dispatched, its products counted among the call's
    two or more (a 32-layer Llama-3-8B traced at ``auto`` once had no MLP
    that chunks could run, where its 2-layer page, traced op by op, had two). Chunking reassociates only sums over
    rows: parameter gradients (and the loss) agree with the plain step to
    rounding, about 1e-7 relative.

    The model: ``expand(graph, chunks)`` is the graph a plan runs. For each
    ``(first, last, k)`` the call's nodes that do not depend on its input
    (the labels' shift) run once, then k copies of the others, each a span
    named ``PATH@chunk{c}/{k}`` (``HEAD+loss@chunk{c}/{k}`` for the tail;
    a plan checkpoints any of them), then one
    node joining them: the sum of the losses, or a ``cat`` (its backward
    hands each chunk a view of its gradient) read where the call's output
    was. The copies are the chunks the runtime makes (:func:`chunk_rows`):
    of the call's R rows (``Node.rows`` of its first node, recorded by the
    trace), ``ceil(R / k)`` rows each and the last one shorter, and fewer
    than k copies when fewer fill the rows (6 rows in 4 chunks: 2, 2, 2). A
    copy of r rows carries ``b // R * r + b % R`` of each node's bytes and
    FLOPs ``b``: what scales with the rows, and the remainder whole (what
    does not scale, such as a scalar's 4 bytes); a node whose output is not
    over the rows (the loss) keeps its output bytes whole. A graph that does
    not record the rows (traced before they were, or hand-built) falls back
    to the tail's labels for R, or else to k copies of ``b // k + b % k``
    (exact when k divides the rows; once under the allocator by 8 to 172 B
    where it did not). A graph traced for a CUDA target counts every storage
    in the caching allocator's 512-B blocks (NOTE [ CUDA blocks ] in
    ``scheduler.tracing.records``), and each chunk's tensors are rounded up
    on their own: so each copy's bytes are rounded up to a block
    (``graphs.storage_unit``). Sharing out the whole call's rounded bytes
    measured up to 6,477 B over the prediction on an H200 (a random module's
    plan with chunked calls). A parameter's gradient is created by the
    backward of the last chunk (the first to run); each earlier chunk's
    backward computes its own (a transient of that size) and autograd adds it
    into the first. The first of those additions is out of place (the first
    gradient is the transposed view ``mm`` hands ``linear``'s weight, which
    autograd's input buffer does not add into: measured on torch 2.13), so
    chunk ``k - 2`` holds two transients and the earlier ones one. That
    transient is the copy's ``workspace_bytes``, so its forward step is
    charged it too (an over-estimate there only). Spans around the call grow
    to hold the copies; spans inside it are replaced by the chunks'.

    A tail whose head is a plain linear layer runs fused instead (NOTE
    [ Fused head ] in ``solvers.model.fused``): ``expand`` then replaces it
    by the fused nodes, no copies, and k = 1 is a plan of its own.

    Plans are solved on the expanded graph with every solver unchanged;
    ``Plan.chunks`` lists the ``(first, last, k)`` and the plan's regions and
    kept nodes are positions of the expanded graph, which ``simulate``,
    ``Plan.validate`` and the brute force read. ``solve_chunked``
    (``solvers.menus.chunks``) chooses k by solving once per menu entry (one k
    for the tail, one for every row-wise call), so an exact solver is exact
    over the menu (NOTE [ Chunk menus ]).

NOTE [ Chunk counts and rows ]
    A call runs in at most as many chunks as it has token rows: more would be
    empty chunks, and a count such as 10**6 would have :func:`expand` build
    millions of copies (a plan file edited to 10**6 chunks once grew an API
    step to 6.9 GB and never answered). The rows are bounded from the
    inputs the graph's meta records (:func:`token_rows`, :func:`max_chunks`):
    the tail's rows are its labels', so the most elements of an integer input
    (``input_ids``, ``labels``: batch x sequence, the rows transformers
    flattens; a classifier's ``[batch]`` labels); another call's rows are at
    most the elements of the largest input (a ViT's MLP rows are patches, not
    labels: no integer input bounds them). On a graph that records no inputs
    (a hand-built one) the bytes of the tensor the call reads bound them (a
    row holds one byte at least). :func:`expand` refuses a larger count
    before it copies a node, ``Plan`` (``normalise_chunks``, the largest
    input of ``graph_meta``) when a plan is built or loaded, and a menu drops
    such counts (NOTE [ Chunk menus ]). The trace records each node's rows
    (``Node.rows``: the product of its output's shape but the last
    dimension), and a call's rows are its first node's: the bound is then the
    rows themselves, and :func:`expand` sizes every chunk by them (NOTE
    [ Chunked head ]). At run time a batch with fewer rows than k runs one
    chunk per row (``scheduler.applying.chunked``).

NOTE [ Which heads run in chunks ]
    A chunked head computes the model's loss itself, chunk by chunk, so it
    runs only where the loss is known: a transformers causal-LM or masked-LM
    model, or a module that wraps one (peft), as ``scheduler.applying.chunked``
    checks. The trace records which submodules of the traced model are such
    models (``graph.meta["lm_heads"]``: ``{path: "causal" | "masked"}``,
    ``graphs.LM_HEADS_META``), and :func:`find_tail` refuses a head none of
    them holds: a chunk menu then leaves the head whole and says why, instead
    of handing ``apply`` a plan it must refuse (a ViT classifier or a
    torchvision ResNet solved with chunks). A graph without the key (an older
    file, a hand-built graph) is read as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from graphs import CALL_RETURNS_META, HOLDS_OP, LM_HEADS_META, Graph, Node, Span, storage_unit

from ..errors import PlanError, SolverInputError
from .fused import fuse, fused_start, is_fused
from .rows import _MATMUL_OPS, _base, _products, call_rows, chunk_rows, token_rows

__all__ = ["CHUNK_MENU", "ROWWISE_OPS", "LOSS_SUFFIX", "ChunkError", "Tail", "find_tail", "find_calls", "chunk_entries", "chunked_graph", "expand",
           "chunk_module", "parse_chunk_module", "token_rows", "max_chunks", "call_rows", "chunk_rows"]


#: The chunk counts the solvers try (1: the call as traced).
CHUNK_MENU = (1, 2, 4, 8, 16)

#: ATen ops that compute each token row from that row alone (with parameters and label rows).
ROWWISE_OPS = _MATMUL_OPS | frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.alias.default",
    "aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default", "aten.contiguous.default",
    "aten.clone.default", "aten._assert_tensor_metadata.default", "aten.gelu.default", "aten.relu.default",
    "aten.silu.default", "aten.tanh.default", "aten.sigmoid.default", "aten.layer_norm.default",
    "aten.native_layer_norm.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.div.Tensor",
    "aten.pow.Tensor_Scalar", "aten.neg.default", "aten.exp.default", "aten.rsqrt.default",
    "aten.dropout.default", "aten.cross_entropy_loss.default",
})
#: What the loss may do to the head's logits before the cross-entropy: views and casts (transformers' upcast).
_LOSS_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                         "aten.alias.default", "aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default",
                         "aten.contiguous.default", "aten._assert_tensor_metadata.default", "holds"})
#: The losses a chunked tail may end in (the sum over chunks is the loss of the whole).
LOSS_OPS = frozenset({"aten.cross_entropy_loss.default"})
_CHUNK_TAG = "@chunk"
#: Added to the head's module path to name the tail (the head call with the loss) in plans.
LOSS_SUFFIX = "+loss"


class ChunkError(SolverInputError):
    """The graph has no call that chunking can run (the message names the node and why)."""


@dataclass(frozen=True)
class Tail:
    """The chunkable tail of a graph: the head call and the loss (NOTE [ Chunked head ]).

    Attributes:
        first: position of the head call's first node; the tail is ``first..len(graph)-1``.
        head: module path of the head call (``lm_head``, ``cls``).
    """

    first: int
    head: str


def _ops(nd: Any) -> frozenset[str]:
    """The ATen ops node ``nd`` runs, as the row-wise check reads them: its own op, or, for a node that groups
    several fx nodes (op ``"2 ops"``: torch.export's ``_assert_tensor_metadata`` with the ``.to`` it checks),
    the ops it dispatched (NOTE [ Chunked head ]: a group of row-wise ops is row-wise), less the weight's
    transpose of a matrix product's lowering."""
    if nd.op in ROWWISE_OPS or not nd.dispatch:
        return frozenset((nd.op,))
    ops = frozenset(nd.dispatch)
    if ops & _MATMUL_OPS:  # a linear's lowering transposes its weight (a parameter, not the rows)
        ops -= {"aten.t.default"}
    return ops


def _split(graph: Graph, first: int, last: int, *, what: str, loss: bool) -> tuple[list[int], list[int]]:
    """``(chunked, shared)`` positions of ``first..last``, checked row-wise (NOTE [ Chunked head ])."""
    nodes, preds = graph.nodes, graph.preds
    inside: dict[int, bool] = {}
    holds = {i for i in range(first, last + 1) if nodes[i].op == HOLDS_OP}  # NOTE [ Forward holds ]
    for i in range(first, last + 1):  # depends on what the call reads (a hold: on what the call makes)
        inside[i] = any((j < first and i not in holds) or (j >= first and inside[j]) for j in preds[i])
    chunked = [i for i in range(first, last + 1) if inside[i]]
    shared = [i for i in range(first, last + 1) if not inside[i] and i not in holds]
    if not loss and shared:
        raise ChunkError(f"node {nodes[shared[0]].name!r} of {what} does not depend on its input; only a loss's "
                         "labels may be shared by the chunks")
    entry = {_base(graph, j) for i in chunked if i not in holds for j in preds[i] if j < first}
    if len(entry) > 1:
        names = sorted(nodes[j].name for j in entry)
        raise ChunkError(f"{what} reads {len(entry)} tensors from before it ({', '.join(names[:3])}); a chunked call "
                         "reads one, split into row chunks")
    for i in (i for i in chunked if i not in holds):  # a hold runs nothing
        nd = nodes[i]
        ops = _ops(nd)
        if not ops <= ROWWISE_OPS:
            raise ChunkError(f"node {nd.name!r} ({nd.op or 'no op'}) of {what} is not known to compute each token row "
                             "alone, so it cannot run in chunks")
        if nd.stochastic or nd.stateful:
            raise ChunkError(f"node {nd.name!r} of {what} draws random numbers or updates state; chunks would draw or "
                             "update otherwise than the whole")
        if ops & _MATMUL_OPS and len({_base(graph, j) for j in preds[i]}) > 1:
            raise ChunkError(f"node {nd.name!r} ({nd.op}) of {what} multiplies two tensors of the call; only a "
                             "product with a parameter is row-wise")
        for j in preds[i]:
            if j >= first and not inside[j] and nd.op not in LOSS_OPS:
                raise ChunkError(f"node {nd.name!r} of {what} reads the label tensor {nodes[j].name!r}; only the "
                                 "loss may")
    return chunked, shared


def find_tail(graph: Graph) -> Tail:
    """The head call and loss at the end of ``graph``, checked row-wise.

    Raises:
        ChunkError: the last node is no cross-entropy, no submodule call
            produces its logits, or the tail is not row-wise (the node and why).
    """
    return graph.cached("_chunk_tail", lambda: _find_tail(graph))


def _find_tail(graph: Graph) -> Tail:
    n, nodes, preds = len(graph), graph.nodes, graph.preds
    if n < 2 or nodes[-1].op not in LOSS_OPS:
        last = nodes[-1].name if n else "none"
        raise ChunkError(f"the graph ends in {last!r} ({nodes[-1].op if n else 'empty'}), not in a cross-entropy "
                         "loss: only a head whose loss the traced step computes can be chunked (trace with the labels)")
    logits = preds[n - 1][0] if preds[n - 1] else -1
    while logits >= 0 and preds[logits] and not any(sp.first <= logits <= sp.last < n - 1 for sp in graph.spans):
        logits = preds[logits][0]  # back through views and casts (a bf16 model's logits upcast for the loss)
    heads = [sp for sp in graph.spans if sp.first <= logits <= sp.last and sp.last < n - 1]
    if logits < 0 or not heads:
        raise ChunkError(f"no submodule call produces the logits the loss {nodes[-1].name!r} reads: a chunked head "
                         "is one submodule call (trace the model itself, so the graph records its calls)")
    head = min(heads, key=lambda sp: (sp.first, -sp.last))
    known = graph.meta.get(LM_HEADS_META)
    if known is not None and not any(p == "" or head.module.startswith(p + ".") for p in known):
        raise ChunkError(f"the head {head.module!r} computes a loss only transformers causal-LM and masked-LM models "
                         f"have a chunked form of, and {graph.meta.get('model', 'the traced model')} is neither "
                         "(NOTE [ Which heads run in chunks ])")
    chunked, _ = _split(graph, head.first, n - 1, what=f"the head {head.module!r} and its loss", loss=True)
    changed = [i for i in chunked if head.last < i < n - 1 and not _ops(nodes[i]) <= _LOSS_VIEWS]
    if changed:  # soft-capping (Gemma 2: div, tanh, mul): the applier cannot hand the loss the head's own output
        nd = nodes[changed[0]]
        raise ChunkError(f"{graph.meta.get('model', 'the model')} changes the logits after its head {head.module!r} "
                         f"(node {nd.name!r}, {nd.op}: soft-capping or scaling), so the loss cannot run in chunks of "
                         "the head's output")
    return Tail(first=head.first, head=head.module)


def find_calls(graph: Graph) -> tuple[Span, ...]:
    """The row-wise calls of ``graph`` that chunks may run (an MLP's), outermost only, outside the tail."""
    return graph.cached("_chunk_calls", lambda: _find_calls(graph))


def _find_calls(graph: Graph) -> tuple[Span, ...]:
    try:
        end = find_tail(graph).first
    except ChunkError:
        end = len(graph)
    last_reader = [max(s, default=-1) for s in graph.succs]
    returns = graph.meta.get(CALL_RETURNS_META) or {}
    found: list[Span] = []
    for sp in graph.spans:  # sorted by (first, -last): an outer call comes before the calls inside it
        if sp.last >= end or (found and sp.first <= found[-1].last) or sp.module in returns:
            continue  # in the tail, inside a call found, or returning more than one tensor
        if "[" in sp.module:  # a run of nn.Sequential children ("body[0:2]"): no one forward to run in chunks;
            continue  # its calls are candidates each (a run offered here failed at apply: ChunkedHeadError)
        if sum(_products(graph.nodes[i]) for i in range(sp.first, sp.last + 1)) < 2:
            continue  # an MLP has two products or more; one alone buys nothing in chunks
        out = _base(graph, sp.last)
        if any(last_reader[i] > sp.last and _base(graph, i) != out for i in range(sp.first, sp.last)) \
                or not graph.succs[sp.last]:
            continue  # read after the call besides its output (and views of it)
        try:
            _split(graph, sp.first, sp.last, what=f"call {sp.module!r}", loss=False)
        except ChunkError:
            continue
        found.append(sp)
    return tuple(found)


def max_chunks(graph: Graph, first: int, last: int) -> int:
    """The most chunks the call ``first..last`` of ``graph`` runs in, its rows or a bound on them (NOTE [ Chunk
    counts and rows ]): the rows the trace recorded (:func:`call_rows`); else for the tail the most elements of an
    integer input (its labels), for another call those of any input; on a graph that records no inputs, the bytes
    of the tensor the call reads (a row holds one byte at least)."""
    rows = call_rows(graph, first, last)
    if rows is None:
        rows = token_rows(graph.meta)
    if rows is not None:
        return max(rows, 1)
    entry = [_base(graph, j) for i in range(first, last + 1) for j in graph.preds[i] if j < first]
    return max([graph.nodes[j].out_bytes for j in entry] + [1])


def normalise_chunks(chunks: Any, meta: Mapping[str, Any] | None = None) -> tuple[tuple[int, int, int], ...]:
    """``Plan.chunks`` sorted and checked: disjoint ``(first, last, k >= 1)`` triples of integers (k = 1: a fused
    head, which ``expand`` checks), ``k`` no more
    than the elements of the largest input ``meta`` (the plan's ``graph_meta``) records (NOTE [ Chunk counts and
    rows ]).

    Raises:
        PlanError: naming the entry at fault.
    """
    out = tuple(sorted(tuple(c) for c in chunks))
    rows = token_rows(meta or {})
    for c in out:
        if len(c) != 3 or any(isinstance(v, bool) or not isinstance(v, int) for v in c) or not 0 <= c[0] <= c[1] \
                or c[2] < 1:
            raise PlanError(f"a chunked call is a (first node, last node, k >= 1 chunks) triple of integers, got {c!r}")
        if rows is not None and c[2] > rows:
            raise PlanError(f"the chunked call ({c[0]}, {c[1]}) runs in {_count(c[2])} chunks, more than the {rows} "
                            f"rows its step was traced with can have: at most {rows} (an edited plan? solve again)")
    for (a1, b1, _), (a2, b2, _) in zip(out, out[1:]):
        if a2 <= b1:
            raise PlanError(f"chunked calls ({a1}, {b1}) and ({a2}, {b2}) overlap; they must be disjoint")
    return out


def _count(k: int) -> str:
    """``k`` for a message: a count too long to read (an edited plan's 10**30) shortened."""
    text = str(k)
    return text if len(text) <= 12 else f"{text[:3]}...({len(text)} digits)"


def chunk_paths(graph: Graph, chunks: Sequence[tuple[int, int, int]]) -> tuple[str, ...]:
    """``Plan.chunk_modules``: the module path of each chunked call (``HEAD+loss`` for the tail)."""
    return tuple(find_tail(graph).head + LOSS_SUFFIX if b == len(graph) - 1 else graph.span_module((a, b))
                 for a, b, _ in chunks)


def chunk_module(path: str, c: int, k: int) -> str:
    """The span name of chunk ``c`` of ``k`` of the call at ``path``."""
    return f"{path}{_CHUNK_TAG}{c}/{k}"


def parse_chunk_module(path: str) -> tuple[str, int, int] | None:
    """``(path, c, k)`` of a chunk's span name, or None for any other path."""
    head, tag, rest = path.rpartition(_CHUNK_TAG)
    if not tag or "/" not in rest:
        return None
    c, _, k = rest.partition("/")
    return (head, int(c), int(k)) if c.isdigit() and k.isdigit() else None


def _part(value: int, rows: int, part: int, unit: int = 1) -> int:
    """The share of ``value`` (bytes or FLOPs of a node over ``rows`` rows) of a chunk of ``part`` rows: what scales
    with the rows, and the remainder whole (NOTE [ Chunked head ]: a 4-byte loss, a scalar's saved total); bytes
    rounded up to a multiple of ``unit`` (``graphs.storage_unit``: a chunk's storages are blocks of their own)."""
    share = value // rows * part + value % rows
    return -(-share // unit) * unit


def chunk_entries(graph: Graph, head_k: int, call_k: int = 1, fused_whole: bool = False
                  ) -> tuple[tuple[int, int, int], ...]:
    """``Plan.chunks`` for the tail in ``head_k`` chunks and every row-wise call in ``call_k`` (1: unchunked;
    ``fused_whole``: a fusable tail in 1 chunk runs fused, NOTE [ Fused head ] in ``solvers.model.fused``)."""
    out = [(sp.first, sp.last, call_k) for sp in find_calls(graph)] if call_k > 1 else []
    if head_k > 1 or fused_whole and head_k == 1 and _fused_tail(graph):
        out.append((find_tail(graph).first, len(graph) - 1, head_k))
    return tuple(out)


def _fused_tail(graph: Graph) -> bool:
    try:
        return is_fused(graph, find_tail(graph).head)
    except ChunkError:
        return False


def chunked_graph(graph: Graph, head_k: int, call_k: int = 1) -> Graph:
    """The graph a plan with the tail in ``head_k`` chunks and every row-wise call in ``call_k`` runs."""
    return expand(graph, chunk_entries(graph, head_k, call_k))


def expand(graph: Graph, chunks: Sequence[tuple[int, int, int]]) -> Graph:
    """The graph a plan with ``chunks`` (``Plan.chunks``) runs: ``graph`` itself when there are none.

    Raises:
        ChunkError: an entry is no chunkable call of ``graph`` (:func:`find_tail`, :func:`find_calls`), or k < 2.
    """
    if not chunks:
        return graph
    key = "_chunked_" + ",".join(f"{a}:{b}:{k}" for a, b, k in sorted(chunks))
    return graph.cached(key, lambda: _expand(graph, sorted(chunks)))


def _expand(graph: Graph, chunks: Sequence[tuple[int, int, int]]) -> Graph:
    calls = {(sp.first, sp.last): sp.module for sp in find_calls(graph)}
    n = len(graph)
    out = graph
    for first, last, k in reversed(chunks):  # from the end, so earlier positions stay where they are
        fused = last == n - 1 and is_fused(graph, find_tail(graph).head)  # NOTE [ Fused head ] in solvers.model.fused
        if isinstance(k, bool) or not isinstance(k, int) or k < (1 if fused else 2):
            raise ChunkError(f"a chunked call runs in k >= 2 chunks (a fused head: k >= 1), got k={k!r}")
        if last == n - 1:
            tail = find_tail(graph)
            if first != tail.first:
                raise ChunkError(f"a chunked tail starts at node {first}, but the head {tail.head!r} of this graph "
                                 f"starts at node {tail.first}; solve again")
            path, loss = tail.head + LOSS_SUFFIX, True
        elif (first, last) in calls:
            path, loss = calls[(first, last)], False
        else:
            raise ChunkError(f"nodes {first}..{last} are no call of this graph that chunks can run (row-wise, one "
                             "input, one output); solve again")
        if k > (most := max_chunks(graph, first, last)):  # NOTE [ Chunk counts and rows ]: before any copy is made
            raise ChunkError(f"{path!r} runs in {_count(k)} chunks, more than the rows it computes: at most {most}; "
                             "solve again")
        if fused:  # from the output layer's call on (the head's layers before it run whole)
            start = fused_start(graph, find_tail(graph).head, first)
            out = fuse(out, start, last, k, *_split(graph, start, last, what=path, loss=True))
        else:
            out = _build(out, first, last, k, path, loss=loss)
    meta = {**graph.meta, "chunks": [list(c) for c in chunks]}
    return dataclasses.replace(out, meta=meta)


def _build(graph: Graph, first: int, last: int, k: int, path: str, *, loss: bool) -> Graph:
    nodes = graph.nodes
    chunked, shared = _split(graph, first, last, what=path, loss=loss)
    rows = call_rows(graph, first, last)
    # NOTE [ Chunked head ]: the chunks the runtime makes, or (rows unknown) k parts of b // k + b % k
    sizes = chunk_rows(rows, k) if rows else [1] * k
    total = rows or k
    m = len(sizes)
    out: list[Node] = list(nodes[:first]) + [nodes[i] for i in shared]
    spans: list[Span] = []
    copies = []
    unit = storage_unit(graph.meta)
    for c, part in enumerate(sizes):
        rename = {nodes[i].name: f"{nodes[i].name}@{c}" for i in chunked}
        start = len(out)
        for i in chunked:
            nd = nodes[i]
            extra = nd.param_bytes * (2 if c == m - 2 else 1 if c < m - 2 else 0)  # NOTE [ Chunked head ]
            whole = rows and nd.rows and nd.rows != rows  # an output not over the rows (the loss): not split
            out.append(dataclasses.replace(
                nd, name=rename[nd.name], inputs=tuple(rename.get(x, x) for x in nd.inputs),
                saves_inputs=tuple(rename.get(x, x) for x in nd.saves_inputs),
                out_bytes=nd.out_bytes if whole else _part(nd.out_bytes, total, part, unit),
                saved_bytes=_part(nd.saved_bytes, total, part, unit),
                workspace_bytes=_part(nd.workspace_bytes, total, part, unit) + extra,
                param_bytes=nd.param_bytes if c == m - 1 else 0, fwd_flops=_part(nd.fwd_flops, total, part),
                bwd_flops=_part(nd.bwd_flops, total, part), fwd_cost=_part(nd.fwd_cost, total, part), members=(),
                sac_op=-1, rows=part if nd.rows == rows else nd.rows))
        spans.append(Span(start, len(out) - 1, chunk_module(path, c, k)))
        copies.append(out[-1].name)
    out.extend(dataclasses.replace(nodes[i], workspace_bytes=_part(nodes[i].workspace_bytes, total, sizes[-1], unit))
               for i in range(first, last + 1) if i not in chunked and i not in shared)  # holds: the last chunk's step
    end = nodes[last]
    join = f"{end.name}@{'sum' if loss else 'cat'}"
    result = _base(graph, last)  # what is read after the call is its output, or what that is a view of
    out.append(Node(name=join, inputs=tuple(copies), out_bytes=nodes[result].out_bytes, requires_grad=end.requires_grad,
                    workspace_bytes=end.out_bytes if loss else 0, fwd_flops=k if loss else 0, bwd_flops=0,
                    op="aten.add.Tensor" if loss else "aten.cat.default", saves_inputs=(), grad_views=not loss,
                    module=end.module))
    delta = len(out) - (last + 1)
    read = {nodes[i].name for i in chunked if i == last or _base(graph, i) == result}
    for nd in nodes[last + 1:]:
        out.append(dataclasses.replace(nd, inputs=tuple(join if x in read else x for x in nd.inputs),
                                       saves_inputs=tuple(join if x in read else x for x in nd.saves_inputs)))
    for sp in graph.spans:
        if sp.last < first:
            spans.append(sp)
        elif sp.first > last:
            spans.append(dataclasses.replace(sp, first=sp.first + delta, last=sp.last + delta))
        elif sp.first <= first and sp.last >= last and (sp.first, sp.last) != (first, last):
            spans.append(dataclasses.replace(sp, last=sp.last + delta))  # a call around the chunked one
    # NOTE [ The user's loop ] in graphs.graph: a chunked head returns no logits (the caller holds none); a
    # chunked call's result is its cat
    gone = {nodes[i].name for i in chunked}
    outputs = tuple(join if name in read else name for name in graph.outputs if name not in gone or name in read)
    return dataclasses.replace(graph, nodes=tuple(out), spans=tuple(spans), outputs=outputs)
