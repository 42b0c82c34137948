"""What sets the minimum: the step no checkpoint plan can make smaller.

Checkpointing frees what autograd saves between the forward and the backward.
It cannot shrink what one op needs while it runs: during node ``i``'s backward
the step holds the parameters, the inputs, the parameter gradients made so far,
the gradient of ``i``'s output, the gradients it produces for its inputs, what
it saved (recomputed or not) and its workspace; in its forward, its inputs,
its output and its workspace. That sum is a lower bound on the peak of *every*
plan (:func:`node_floors`). When the best plan's peak (from ``simulate``)
is within a few percent of the largest bound, that node sets the floor: at
sequence 256 and batch 2 on GPT-2 it is the LM head and cross-entropy backward
(logits-sized buffers and the vocabulary-sized weight gradient).

The bound only counts the node's own tensors; ``simulate`` of the best plan
gives the real peak, whose step and breakdown :func:`explain_floor` reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from graphs import CkptError, Graph
from solvers import Plan, Simulation, format_bytes, simulate, terms_of
from solvers.menus.nested import nest_to_fit
from solvers.model.chunks import (CHUNK_MENU, ChunkError, chunk_entries, chunked_graph, expand, find_tail, max_chunks,
                                  parse_chunk_module)

log = logging.getLogger(__name__)

__all__ = ["NodeFloor", "Floor", "node_floors", "explain_floor"]

#: Best-plan peak within this share of the bound: the node "sets the floor".
TIGHT = 0.10


@dataclass(frozen=True)
class NodeFloor:
    """Bytes node ``name`` needs at once in its ``phase``, whatever the plan.

    Attributes:
        name: node name.
        phase: ``forward`` or ``backward``.
        bytes: the total (a lower bound on any plan's peak).
        parts: what it is made of (category -> bytes).
    """

    name: str
    phase: str
    bytes: int
    parts: Mapping[str, int]


@dataclass(frozen=True)
class Floor:
    """Why the least peak is what it is.

    Attributes:
        bound: the largest :class:`NodeFloor` (no plan goes below ``bound.bytes``).
        best_peak_bytes: ``simulate`` peak of the plan examined.
        sim: that simulation (peak step, node, breakdown).
        tight: the plan's peak is within :data:`TIGHT` of the bound.
        text: one paragraph for people.
    """

    bound: NodeFloor
    best_peak_bytes: int
    sim: Simulation
    tight: bool
    text: str


def node_floors(graph: Graph) -> list[NodeFloor]:
    """A lower bound per node and phase on the peak of every plan."""
    nodes = graph.nodes
    idx = graph.index
    saves = terms_of(graph).saves
    base = graph.param_bytes + graph.input_bytes
    unattributed = graph.unattributed_grad_bytes()
    out: list[NodeFloor] = []
    succs = graph.succs
    last = len(nodes) - 1
    pgrad_after = [0] * (len(nodes) + 1)  # parameter grads made by the backward of nodes >= i
    for i in range(len(nodes) - 1, -1, -1):
        pgrad_after[i] = pgrad_after[i + 1] + (nodes[i].param_bytes if nodes[i].requires_grad else 0)
    for i, nd in enumerate(nodes):
        ins = list(dict.fromkeys(nd.inputs))
        fwd = {"params+inputs": base, "node inputs": sum(nodes[idx[j]].out_bytes for j in ins),
               "output": nd.out_bytes, "workspace": nd.workspace_bytes}
        out.append(NodeFloor(nd.name, "forward", sum(fwd.values()), fwd))
        if not nd.requires_grad:
            continue
        bwd = {
            "params+inputs": base,
            "param grads": unattributed + pgrad_after[i],
            "grad of output": nd.out_bytes if (i == last or any(nodes[k].requires_grad for k in succs[i])) else 0,
            "grads of inputs": sum(nodes[idx[j]].out_bytes for j in ins if nodes[idx[j]].requires_grad),
            "saved tensors": sum(nodes[j].out_bytes for j in saves[i]) + nd.saved_bytes,
            "workspace": nd.workspace_bytes,
        }
        out.append(NodeFloor(nd.name, "backward", sum(bwd.values()), bwd))
    return out


def explain_floor(graph: Graph, plan: Plan | None = None, *, levers: bool = True, nested_lever: bool = True) -> Floor:
    """Explain the least peak: which node sets it and why no plan goes lower.

    Args:
        graph: the cost graph.
        plan: the plan with the lowest peak found (e.g. every node
            checkpointed, or a solver's answer); ``None``: store-all.
        levers: also say what a chunked head would buy (NOTE [ Chunked head ]
            in ``solvers.model.chunks``), where the graph has one and ``plan`` does not chunk it.
        nested_lever: also say what nesting the plan's regions would buy (NOTE
            [ Nested regions ] in ``solvers.model.nested``), where ``plan`` nests none.

    Returns:
        A :class:`Floor` with the bound, the plan's simulated peak and a text.
    """
    sim = simulate(graph, plan)
    planned = expand(graph, plan.chunks) if plan is not None else graph  # chunked plans name the chunked graph's nodes
    who = "storing everything" if plan is None or not plan.regions else "the lowest-peak plan found"
    bound = max(node_floors(graph), key=lambda f: f.bytes)
    tight = sim.peak_bytes <= bound.bytes * (1 + TIGHT)
    node = graph.nodes[graph.index[bound.name]]
    where = f"{bound.name}" + (f" [{node.module}]" if node.module else "") + (f" ({node.op})" if node.op else "")
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in bound.parts.items() if v)
    peak_node = planned.nodes[planned.index[sim.peak_node]]
    peak_at = f"{sim.peak_phase} of {sim.peak_node}" + (f" [{peak_node.module}]" if peak_node.module else "")
    if tight:
        text = (f"The floor is set by the {bound.phase} of {where}: it needs {format_bytes(bound.bytes)} at once "
                f"({parts}). Checkpointing only frees what is saved between forward and backward, not what one op "
                f"holds while it runs, so no plan of whole calls can go below {format_bytes(bound.bytes)}; {who} peaks at "
                f"{format_bytes(sim.peak_bytes)} during the {peak_at}. To go lower: a smaller batch or sequence, a "
                "lower-precision dtype, or a chunked op (e.g. a chunked LM-head loss).")
    else:
        brk = ", ".join(f"{k} {format_bytes(v)}" for k, v in sim.breakdown.items() if v)
        text = (f"{who[0].upper()}{who[1:]} peaks at {format_bytes(sim.peak_bytes)} during the {peak_at} ({brk}). The largest "
                f"single-op need is {format_bytes(bound.bytes)} in the {bound.phase} of {where}; the rest of the "
                "peak is what other nodes keep at that moment.")
    text += _chunk_lever(graph, plan, sim.peak_bytes) if levers else ""
    text += _nested_lever(planned, plan, sim.peak_bytes) if nested_lever else ""
    return Floor(bound=bound, best_peak_bytes=sim.peak_bytes, sim=sim, tight=tight, text=text)


def _nested_lever(planned: Graph, plan: Plan | None, peak_bytes: int) -> str:
    """What nesting this plan's regions (each with its child calls checkpointed inside its recompute) would
    buy (NOTE [ Nested regions ] in ``solvers.model.nested``), or ""."""
    if plan is None or plan.inner or not plan.regions:
        return ""
    nested, lower = nest_to_fit(planned, plan.regions, -1, exhaustive=False)
    if lower < 0 or lower >= peak_bytes:
        return ""
    return (f" Nesting its regions (each region's child calls checkpointed again inside its recompute, a second "
            f"recompute for less memory) would bring this plan to {format_bytes(lower)} "
            f"(-{format_bytes(peak_bytes - lower)}): solve with --nested (scheduler.solve(..., nested=True)).")


def _chunk_lever(graph: Graph, plan: Plan | None, peak_bytes: int) -> str:
    """What running the LM head and its loss in chunks would buy this plan (NOTE [ Chunked head ]), or ""."""
    if plan is not None and plan.chunks:
        return ""
    try:
        tail = find_tail(graph)
    except ChunkError:
        return ""
    fitting = [c for c in CHUNK_MENU if c <= max_chunks(graph, tail.first, len(graph) - 1)]
    if not fitting or fitting[-1] < 2:  # fewer rows than two chunks (NOTE [ Chunk counts and rows ])
        return ""
    k = fitting[-1]
    try:  # a lever, never the error: DenseNet's head over 4 rows in 16 chunks raised a GraphError here
        chunked = chunked_graph(graph, k)
        kept = [r for r in (plan.regions if plan is not None else ()) if r[1] < tail.first]
        regions = kept + [(sp.first, sp.last) for sp in chunked.spans if parse_chunk_module(sp.module)]
        lower = simulate(graph, Plan(regions=regions, chunks=chunk_entries(graph, k))).peak_bytes
    except CkptError as exc:
        log.info("floor: no chunk lever for this graph (%s)", exc)
        return ""
    if lower >= peak_bytes:
        return ""
    return (f" Running the head {tail.head!r} and its loss in {k} chunks, each recomputed, would bring this plan to "
            f"{format_bytes(lower)} (-{format_bytes(peak_bytes - lower)}): solve with --chunks "
            f"{','.join(map(str, CHUNK_MENU))} (scheduler.solve(..., chunks=...)).")
