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

from graphs import Graph

__all__ = ["COLWISE", "ROWWISE", "EMBEDDINGS", "tp_roles", "split_tensor_parallel", "split_bytes"]

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


def split_tensor_parallel(graph: Graph, tp: int, *, sequence_parallel: bool = False) -> Graph:
    """The graph one of ``tp`` tensor-parallel ranks runs (NOTE [ Tensor-parallel activations ]).

    Returns ``graph`` itself for ``tp == 1``; otherwise a graph of the same
    nodes and spans whose split nodes hold ``1/tp`` of their output, saved
    buffers and workspace, and whose split modules hold ``1/tp`` of their
    parameters.
    """
    if tp == 1:
        return graph
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
