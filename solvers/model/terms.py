"""The execution model's per-graph terms, derived once per graph.

NOTE [ One table of terms ]
    ``simulate``, the DP's node arrays, the CP-SAT model and the floor
    explanation all ask the same questions of a graph before they cost a
    plan: which tensors does each node save for its backward (NOTE [ What a
    node saves ] in ``graphs.node``), which later nodes save a given tensor,
    who reads a tensor last, which tensors the caller holds to the end of the
    step (sinks, which nobody reads, and the model's outputs under the
    ``"held"`` loop, NOTE [ The user's loop ] in ``graphs.graph``).
    :func:`terms_of` answers them here, for
    all of them, and keeps the answer on the graph, so a solver that builds
    several models of one graph derives them once. Positions are indices in
    the topological order; :data:`INF` stands for "no such node".

NOTE [ RNG state per region ]
    A region that draws random numbers (a node ``stochastic``) is
    checkpointed with ``preserve_rng_state=True``: before its forward runs,
    checkpoint stores the generator state (``torch.get_rng_state()``, a
    tensor of ``graph.rng_state_bytes``) in the region's frame, beside its
    inputs, so it lives exactly as long as they do: from the forward step of
    the region's first node to the backward of that node. Its recompute runs
    under ``torch.random.fork_rng``, which saves the generator's current
    state once more for the recompute's duration. So for such a region
    ``rng_state_bytes`` joins the activations at its first forward step,
    again for every step of its recompute, and leaves with its inputs.
    Regions without a stochastic node store nothing (the appliers pass
    ``preserve_rng_state=False``). The generator states of CUDA devices are
    host tensors too: a trace on a GPU records ``rng_state_bytes=0`` for the
    device's budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphs import HOLDS_OP, Graph
from graphs.reading import poll

__all__ = ["INF", "Terms", "terms_of", "region_rng_bytes"]

#: A position after every node: "none" in ``first_saver`` and kin, safe in integer arithmetic.
INF = 1 << 40

_CACHE_KEY = "_execution_terms"


@dataclass(frozen=True)
class Terms:
    """What the execution model reads off a graph, whatever the plan.

    Attributes:
        saves: per node, the distinct tensors (producer positions) autograd
            keeps for its backward: its saved inputs in order, then its own
            output when it saves it; ``()`` for a node without grad.
        savers: per tensor, the consumers with grad that save it, ascending.
        self_save: per tensor, whether its producer (with grad) saves it.
        first_saver: per tensor, the first node that saves it (its producer
            or a consumer), :data:`INF` for none.
        first_consumer_saver: per tensor, the first *consumer* that saves it,
            :data:`INF` for none.
        last_reader: per tensor, the position of its last consumer, -1 for none.
        sinks: per tensor, held by the caller from its forward step to the
            end of the step: no consumer reads it, or it is an output the
            loop holds (``Graph.held_outputs``). A held output may have
            consumers (``last_reader`` >= 0); only its forward copy is the
            caller's, a recomputed copy is freed as any other.
        sink_bytes_after: ``sink_bytes_after[k]``, bytes of the sinks at
            position ``k`` or later (length ``n + 1``, 0 at ``n``).
    """

    saves: tuple[tuple[int, ...], ...]
    savers: tuple[tuple[int, ...], ...]
    self_save: tuple[bool, ...]
    first_saver: tuple[int, ...]
    first_consumer_saver: tuple[int, ...]
    last_reader: tuple[int, ...]
    sinks: tuple[bool, ...]
    sink_bytes_after: tuple[int, ...]


def terms_of(graph: Graph) -> Terms:
    """The :class:`Terms` of ``graph``, computed on first use and kept on it (NOTE [ One table of terms ])."""
    return graph.cached(_CACHE_KEY, lambda: _derive(graph))


def _derive(graph: Graph) -> Terms:
    poll("deriving the graph's tables")  # a caller's stop check (NOTE [ Reading a graph under a deadline ])
    nodes = graph.nodes
    n = len(nodes)
    idx = graph.index
    graph.succs  # noqa: B018  (computed here, between two polls)
    poll("deriving the graph's tables")
    saves: list[tuple[int, ...]] = []
    savers: list[list[int]] = [[] for _ in range(n)]
    for k, nd in enumerate(nodes):
        if not nd.requires_grad:
            saves.append(())
            continue
        mine = list(dict.fromkeys(idx[name] for name in nd.saves_inputs))
        for j in mine:
            savers[j].append(k)
        if nd.saves_output:
            mine.append(k)  # an input is never the node itself (Graph.validate)
        saves.append(tuple(mine))
    self_save = tuple(bool(nd.requires_grad and nd.saves_output) for nd in nodes)
    first_consumer = tuple(s[0] if s else INF for s in savers)
    first_saver = tuple(j if self_save[j] else first_consumer[j] for j in range(n))
    last_reader = tuple(s[-1] if s else -1 for s in graph.succs)
    held = set(graph.held_outputs())
    # read by holds alone (NOTE [ Forward holds ]): still what nobody consumes, held by the caller to the end
    holds = [nd.op == HOLDS_OP for nd in nodes]
    sinks = tuple(all(holds[c] for c in s) or k in held for k, s in enumerate(graph.succs))
    after = [0] * (n + 1)
    for k in range(n - 1, -1, -1):
        after[k] = after[k + 1] + (nodes[k].out_bytes if sinks[k] else 0)
    return Terms(saves=tuple(saves), savers=tuple(tuple(s) for s in savers), self_save=self_save,
                 first_saver=first_saver, first_consumer_saver=first_consumer, last_reader=last_reader,
                 sinks=sinks, sink_bytes_after=tuple(after))


def region_rng_bytes(graph: Graph, regions) -> list[int]:  # noqa: ANN001
    """Per region, the generator state it stores: ``graph.rng_state_bytes`` when a node in it is
    stochastic, else 0 (NOTE [ RNG state per region ])."""
    rng = graph.rng_state_bytes
    if not rng:
        return [0] * len(regions)
    nodes = graph.nodes
    return [rng if any(nodes[k].stochastic for k in range(a, b + 1)) else 0 for a, b in regions]
