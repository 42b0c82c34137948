"""What one tensor-parallel rank holds of a graph: split activations and split weights.

NOTE [ Tensor-parallel activations ]
    Tensor parallelism (Megatron-LM; torch's ``parallelize_module``) splits a
    block's column-wise linears (attention's query, key and value, the MLP's
    up and gate projections) by output feature and its row-wise linears
    (attention's output projection, the MLP's down projection) by input
    feature, across ``tp`` ranks. What a rank computes between the two is
    its share of the heads or of the hidden width, so every activation from
    a column-wise linear's matmul up to the next row-wise linear's matmul
    (scores, softmax, attention output, the activation function, the gate's
    product) is ``1/tp`` of the single-rank tensor, and so are the buffers
    saved with it. The row-wise matmul's output is whole again (after its
    all-reduce), as are the norms, dropouts and residual adds between blocks.
    The graph is read that way node by node:

    * a node inside a column-wise module (named ``q_proj``, ``c_attn``,
      ``up_proj``, ``c_fc``, ``lm_head``... :data:`COLWISE`) is split from its
      module's matmul on (the module's node with the most FLOPs; the views of
      its input before it are not);
    * a node inside a row-wise module (:data:`ROWWISE`) is split before its
      module's matmul when what it reads is, and whole from the matmul on;
    * any other node is split when one of its inputs is (the attention
      between the projections, the MLP's activation); masks, position ids and
      the residual stream read nothing split and stay whole.

    ``lm_head`` is column-wise with a parallel loss (torchtitan's default),
    so the logits and the loss's saved log-probabilities are split too. The
    embeddings (:data:`EMBEDDINGS`) are vocabulary-parallel: their weights are
    split, their output is whole.

    With sequence parallelism (Megatron's, torch's ``SequenceParallel``) the
    activations left whole above are split along the sequence instead:
    every node with a gradient that is not split already, except the inputs
    of the column-wise linears, which are all-gathered to the whole sequence
    before the matmul and saved whole (torch's ``ColwiseParallel`` saves the
    gathered tensor; Megatron re-gathers it in the backward and would hold
    less). Tensors without a gradient (masks, rotary tables) stay whole.

    Weights: every parameter of a column-wise, row-wise, embedding or head
    module counts ``1/tp`` (a row-wise bias is replicated in fact, a few
    bytes per layer); norms stay whole. Split byte counts round up.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from graphs import Graph

__all__ = ["COLWISE", "ROWWISE", "EMBEDDINGS", "tp_roles", "split_tensor_parallel", "split_bytes", "tp_sizes",
           "check_tp_degree", "TP_META"]

#: ``Graph.meta`` key: ``{"heads": [...], "widths": [...]}``, what tensor parallelism splits (:func:`tp_sizes`).
TP_META = "tensor_parallel"
#: Attributes that hold a head count, on a module or its ``config``.
_HEAD_ATTRS = ("num_attention_heads", "num_key_value_heads", "num_heads", "n_head", "n_heads", "heads",
               "num_kv_heads", "n_kv_heads")

#: Module names (the last component of a path) parallelised column-wise.
COLWISE = frozenset({
    "q_proj", "k_proj", "v_proj", "qkv_proj", "qkv", "c_attn", "query", "key", "value", "query_key_value", "Wqkv",
    "wq", "wk", "wv", "gate_proj", "up_proj", "gate_up_proj", "c_fc", "fc1", "w1", "w3", "wi", "wi_0", "wi_1",
    "dense_h_to_4h", "lm_head", "embed_out",
})
#: Module names parallelised row-wise.
ROWWISE = frozenset({"o_proj", "out_proj", "c_proj", "wo", "fc2", "down_proj", "w2", "dense_4h_to_h"})
#: Vocabulary-parallel embeddings: weights split, output whole.
EMBEDDINGS = frozenset({"embed_tokens", "wte", "tok_embeddings", "word_embeddings", "embed_in"})


def split_bytes(n: int, parts: int) -> int:
    """``n`` bytes split ``parts`` ways, rounded up."""
    return -(-int(n) // parts)


def _tp_module(path: str) -> tuple[str, str]:
    """``(kind, module path)`` of the innermost tensor-parallel module holding ``path``; ``("", "")`` for none."""
    parts = path.split(".") if path else []
    for k in range(len(parts), 0, -1):
        name = parts[k - 1]
        if name in COLWISE:
            return "col", ".".join(parts[:k])
        if name in ROWWISE:
            return "row", ".".join(parts[:k])
        if name in EMBEDDINGS:
            return "embed", ".".join(parts[:k])
    return "", ""


def tp_roles(graph: Graph) -> tuple[list[bool], list[str]]:
    """Per node: whether tensor parallelism splits its output (NOTE [ Tensor-parallel activations ]),
    and the kind of tensor-parallel module it lies in (``col``, ``row``, ``embed`` or ``""``)."""
    n = len(graph.nodes)
    kinds, mods = [""] * n, [""] * n
    matmul: dict[str, int] = {}
    for i, nd in enumerate(graph.nodes):
        kinds[i], mods[i] = _tp_module(nd.module)
        if kinds[i] in ("col", "row"):
            best = matmul.get(mods[i])
            if best is None or nd.fwd_flops > graph.nodes[best].fwd_flops:
                matmul[mods[i]] = i
    split = [False] * n
    preds = graph.preds
    for i in range(n):
        reads_split = any(split[j] for j in preds[i])
        if kinds[i] == "col":
            split[i] = i >= matmul[mods[i]] or reads_split
        elif kinds[i] == "row":
            split[i] = i < matmul[mods[i]] and reads_split
        elif kinds[i] == "embed":
            split[i] = False
        else:
            split[i] = reads_split
    return split, kinds


def tp_sizes(model: Any) -> dict[str, list[int]]:
    """What tensor parallelism splits across its ranks, read off the model at trace time: the head counts
    (attributes of its modules and their ``config``) and the widths of its block linears (a column-wise
    linear's outputs, a row-wise one's inputs; the LM head and the embeddings, split by vocabulary, aside)."""
    heads: set[int] = set()
    widths: set[int] = set()
    for path, m in model.named_modules():
        for holder in (m, getattr(m, "config", None)):
            for attr in _HEAD_ATTRS:
                v = getattr(holder, attr, None) if holder is not None else None
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    heads.add(v)
        name = path.rsplit(".", 1)[-1]
        weight = getattr(m, "weight", None)
        shape = tuple(getattr(weight, "shape", ()))
        if len(shape) != 2 or name in ("lm_head", "embed_out"):
            continue
        conv1d = type(m).__name__ == "Conv1D"  # GPT-2's: weight (in, out)
        if name in COLWISE:
            widths.add(int(shape[1] if conv1d else shape[0]))
        elif name in ROWWISE:
            widths.add(int(shape[0] if conv1d else shape[1]))
    return {"heads": sorted(heads), "widths": sorted(widths)}


def check_tp_degree(graph: Graph, tp: int) -> None:
    """Refuse a tensor-parallel degree that does not divide the heads and widths the trace recorded
    (``graph.meta[TP_META]``; a graph traced before it was recorded is not checked).

    Raises:
        LayoutError: naming what ``tp`` does not divide and the degrees that divide all of it.
    """
    sizes = graph.meta.get(TP_META) if hasattr(graph.meta, "get") else None
    if tp == 1 or not sizes:
        return
    heads, widths = list(sizes.get("heads", ())), list(sizes.get("widths", ()))
    bad = [f"{h} heads" for h in heads if h % tp] + [f"width {w}" for w in widths if w % tp]
    if not bad:
        return
    from .layout import LayoutError

    every = heads + widths
    ok = [d for d in range(2, min(every) + 1) if all(v % d == 0 for v in every)] if every else []
    shown = ", ".join(map(str, ok[:8])) + (", ..." if len(ok) > 8 else "")
    raise LayoutError(f"layout: --tp {tp} does not divide the model's {', '.join(bad)} (tensor parallelism splits "
                      f"every head count and block linear width across the ranks); "
                      + (f"use --tp {shown}" if ok else "no --tp above 1 divides them all: use --tp 1"))


def split_tensor_parallel(graph: Graph, tp: int, *, sequence_parallel: bool = False) -> Graph:
    """The graph one of ``tp`` tensor-parallel ranks runs (NOTE [ Tensor-parallel activations ]).

    Returns ``graph`` itself for ``tp == 1``; otherwise a graph of the same
    nodes and spans whose split nodes hold ``1/tp`` of their output, saved
    buffers and workspace, and whose split modules hold ``1/tp`` of their
    parameters.
    """
    if tp == 1:
        return graph
    check_tp_degree(graph, tp)
    split, kinds = tp_roles(graph)
    gathered = [False] * len(graph.nodes)
    if sequence_parallel:
        for i, ps in enumerate(graph.preds):
            if kinds[i] == "col":
                for j in ps:
                    gathered[j] = True
    nodes = []
    param_delta = 0
    for i, nd in enumerate(graph.nodes):
        changes = {}
        if split[i] or (sequence_parallel and nd.requires_grad and not gathered[i]):
            changes.update(out_bytes=split_bytes(nd.out_bytes, tp), saved_bytes=split_bytes(nd.saved_bytes, tp),
                           workspace_bytes=split_bytes(nd.workspace_bytes, tp))
        if kinds[i] and nd.param_bytes:
            changes["param_bytes"] = split_bytes(nd.param_bytes, tp)
            param_delta += nd.param_bytes - changes["param_bytes"]
        nodes.append(dataclasses.replace(nd, **changes) if changes else nd)
    return graph.with_nodes(nodes, param_bytes=graph.param_bytes - param_delta)
