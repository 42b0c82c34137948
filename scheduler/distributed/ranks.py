"""What one rank holds under a layout: its graph, and its state outside the graph.

NOTE [ What a rank holds ]
    A rank of a layout (``scheduler.distributed.layout.Layout``) runs one
    pipeline stage's graph (the whole graph without a pipeline; NOTE [ A
    stage's graph ] in ``scheduler.distributed.stages``) at the micro-batch
    it was traced at, and holds:

    * its share of that stage's weights: ``1/tp`` of the tensor-parallel
      modules' (NOTE [ Tensor-parallel activations ]), then ``1/shard`` of
      everything under FSDP, plus the whole weights of the FSDP units it has
      gathered as the step runs (NOTE [ FSDP2's buffers ]);
    * the gradients of those weights, split the same way (whole for FSDP's
      root until its reduce-scatter at the end);
    * the optimizer state and the fp32 master copy of its share
      (NOTE [ Bytes per parameter ] in ``scheduler.sizing.memory``, divided
      by ``tp`` and ``shard``): outside ``simulate``, subtracted from the
      card like the single-rank budget does;
    * activations as tensor and sequence parallelism split them, times the
      micro-batches its stage holds in flight under the schedule (NOTE
      [ Micro-batches in flight ] in ``scheduler.distributed.schedule``);
    * the Python scalars its stage's autograd nodes save (NOTE [ Saved
      Python scalars ] in ``scheduler.tracing.costs``), also once per
      micro-batch in flight: each forward wraps its own ``0.5``,
      ``0.044715`` and ``sqrt(2 / pi)`` (GPT-2's ``gelu_new``) into 8-byte
      tensors that its ``MulBackward0`` nodes hold until that micro-batch's
      backward. A trace counts them once, in the always-live inputs, which
      is exact for one micro-batch; a stage's graph keeps only its own nodes'
      (per node in ``meta["saved_scalars"]``), and every micro-batch a stage
      holds beside the running one adds them again
      (``ChunkMemory.retained_bytes``). Before, a middle stage counted none
      and the first and last stages the whole model's once: rank 2 of a
      4-stage 1F1B pipeline of transformers' GPT-2 (one block per stage, 2
      micro-batches in flight) measured 48 bytes over its prediction on gloo,
      two micro-batches' 24 (``tests/regressions/test_pipeline_saved_scalars.py``).

    The replicate degree of HSDP changes none of it. :func:`rank_graph` is the
    graph ``simulate`` and the solvers see for one micro-batch of one rank;
    :func:`rank_state` the part outside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphs import Graph

from ..sizing.memory import PersistentState, graph_state
from .fsdp import shard_fsdp
from .layout import Layout
from .tensor_parallel import split_bytes, split_tensor_parallel

__all__ = ["RankState", "rank_graph", "rank_state"]


@dataclass(frozen=True)
class RankState:
    """A rank's persistent state outside ``simulate``'s count (NOTE [ What a rank holds ]).

    Attributes:
        params: parameters of the rank's stage after tensor parallelism (their count, whole).
        shard: the FSDP shard degree they are split over.
        state: the persistent state of those parameters on one rank holding them all
            (``scheduler.sizing.memory.persistent_state``).
        optimizer_bytes: optimizer state on this rank (``1/shard`` of ``state``'s).
        master_bytes: the fp32 master copy on this rank (``1/shard``).
    """

    params: int
    shard: int
    state: PersistentState
    optimizer_bytes: int
    master_bytes: int

    @property
    def outside_simulation_bytes(self) -> int:
        """What ``simulate`` does not count on this rank: optimizer state and master copy."""
        return self.optimizer_bytes + self.master_bytes


def rank_graph(graph: Graph, layout: Layout) -> Graph:
    """The graph one rank runs per micro-batch: ``graph`` (a stage's, or the whole model's) with tensor
    parallelism's split activations and weights, then FSDP's sharded state and gathered units."""
    tp = split_tensor_parallel(graph, layout.tp, sequence_parallel=layout.sequence_parallel)
    return shard_fsdp(tp, layout.shard, units=layout.fsdp_units, forward_prefetch=layout.forward_prefetch,
                      collective_threads=layout.collective_threads)


def rank_state(graph: Graph, layout: Layout, *, optimizer: str | None = "adam",
               mixed_precision: bool = False) -> RankState:
    """The optimizer state and master copy one rank holds for ``graph``'s parameters (a stage's graph,
    before :func:`rank_graph`): ``1/tp`` of the tensor-parallel modules' parameters, then ``1/shard``
    (the dtype from the graph's meta, as ``scheduler.sizing.memory.graph_state`` reads it)."""
    if layout.tp > 1:
        split = split_tensor_parallel(graph, layout.tp)
        graph = split.with_nodes(split.nodes, meta={k: v for k, v in split.meta.items() if k != "parameters"})
    state = graph_state(graph, optimizer=optimizer, mixed_precision=mixed_precision)
    return RankState(params=state.params, shard=layout.shard, state=state,
                     optimizer_bytes=split_bytes(state.optimizer_bytes, layout.shard),
                     master_bytes=split_bytes(state.master_bytes, layout.shard))
