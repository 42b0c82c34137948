"""The execution model: what a plan costs, step by step. The one cost model.

NOTE [ Execution model ]
    This walks a training step (forward, then backward) exactly as PyTorch
    executes a plan whose regions are wrapped in
    ``torch.utils.checkpoint.checkpoint(fn, *region_inputs, use_reentrant=False)``.

    Always live: parameters (``graph.param_bytes``) and model inputs
    (``graph.input_bytes``).

    Forward, node ``i`` in topological order:
      * its output ``out(i)`` and its own saved buffers (``saved_bytes``) are
        allocated, plus ``workspace_bytes`` for the duration of the step;
      * outside a region, autograd keeps what the node saves (NOTE [ What a
        node saves ] in ``graphs.node``); inside a region nothing is saved:
        own buffers are freed at once and tensors die after their last
        forward consumer;
      * a region holds its *inputs* (tensors produced before the region, or in
        another region, and read inside it) until its backward is done;
      * a tensor is freed after its last forward consumer when no node, region
        or the caller holds it. Outputs nobody consumes (the loss, returned
        logits) are held by the caller to the end of the step, and so are the
        model's outputs under the ``"held"`` loop, read or not (NOTE [ The
        user's loop ] in ``graphs.graph``): only their forward copy; a
        region's recompute makes a copy of its own.

    Backward, nodes in reverse order (only nodes with ``requires_grad``):
      * at the start, gradients of parameters neither frozen nor attributed
        to a node (``Graph.unattributed_grad_bytes``) and the
        gradient of the last node's output are allocated; the latter (the
        ``ones`` that ``loss.backward()`` makes) is held by the caller's
        ``torch.autograd.backward`` frame until the whole backward returns;
      * when the backward reaches the last node of a region, the region is
        recomputed once from its inputs: nodes run forward again, keeping
        exactly what they save (new copies) and freeing temporaries as they go;
        the region's outputs (tensors read after the region, or by the
        caller) stay referenced by the running region until its recompute
        ends, then are freed unless a node inside saves them; the buffers of
        its stateful nodes (``state_bytes``) are copied for the recompute's
        duration;
      * node ``i``'s backward allocates a gradient for each input that requires
        grad (kept until that input's own backward; a second contribution is a
        transient buffer added into the first), the gradients of its
        parameters (kept), and its workspace; then frees the gradient of its
        output and releases what it saved;
      * a region releases its inputs after the backward of its first node.
      * a node with ``grad_views`` (``cat``) gives an input whose gradient
        does not exist yet a view of its own output's gradient (no new
        bytes); that storage is freed when the last view's owner has run its
        backward. A later contribution to such an input is added out of place
        (a new gradient tensor replaces the view, made while the view still
        holds its base: NOTE [ Replacing a view gradient ]). See
        :class:`GradientWalk`.

    Eager lifetimes in a recompute: a region is one submodule call, and its
    recompute re-runs that call's eager Python forward, whose locals keep
    some tensors referenced past their last use in the graph. When a
    region's ``(first, last)`` is a span with ``extra_bytes`` (the most the
    call holds beyond the graph's lifetimes, NOTE [ Eager lifetimes in a
    recompute ] in ``scheduler.tracing.eager_lifetimes``), those bytes are
    added to every step of that region's recompute, as activations (like the
    snapshots above); not to the forward, nor for a region that is no span.

    The recompute cost of a plan is the ``fwd_cost`` (``Graph.recompute_costs``)
    of every node in a region (each region is recomputed exactly once), less
    those of the nodes it keeps (NOTE [ Selective recompute ]), beside their
    forward FLOPs; at the graph's rate (``meta["costs"]["flops_per_s"]``) the
    cost is the predicted recompute time.

    A plan with inner regions (``Plan.inner``) runs the steps of NOTE
    [ Nested regions ] in ``solvers.model.nested`` around its outer regions'
    recomputes (``nested_walk``); every other step is this one.

NOTE [ Selective recompute ]
    ``plan.saved`` lists nodes inside regions whose outputs a selective
    checkpoint policy keeps (``CheckpointPolicy.MUST_SAVE`` for the node's
    ``sac_op``): in the region's forward ``_CachingTorchDispatchMode`` stores
    (detached aliases of) what that op returns, and in the recompute
    ``_CachedTorchDispatchMode`` pops them and returns them instead of running
    the op. For a kept node ``k`` of region ``r``:

      * forward: ``out(k)`` and ``k``'s own buffers (``saved_bytes``, whether
        or not ``k`` requires grad) are allocated as usual but not freed when
        the region is done with them: the region's cache holds them (one more
        holder of the forward copy of ``out(k)``) until ``r``'s recompute
        reaches ``k``;
      * recompute: at ``k`` nothing runs (no cost, no FLOPs, no workspace, no
        new allocation; a step with no transient is still recorded); the
        cache lets go and its tensors *are* ``k``'s recomputed copy: from then
        on exactly like a recomputed node (the output freed when no
        recomputed holder needs it and it is no region output still
        referenced; the own buffers released at ``k``'s backward, or at once
        when ``k`` does not require grad);
      * shared storage: when the cache lets go and the forward copy of
        ``out(k)`` is still held by something else (the caller, for a sink;
        a holder released later), the recomputed copy *is* that storage and
        is counted once: it is freed when the last of the two lets go. By the
        order of the backward, every node and region after ``r`` has released
        its holds by then, so in practice only a sink (held by the caller)
        shares.

    ``recompute_flops`` and ``recompute_cost`` leave kept nodes out. A plan
    with ``saved=()`` runs exactly the steps above this note.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

from graphs import Graph
from graphs.reading import poll

from ..errors import SolverInputError
from .chunks import expand
from .nested_walk import NestedWalk
from .plan import Plan
from .overheads import chunk_times, graph_overheads, overhead_seconds
from .walk import Simulation, Walk, graph_rate

__all__ = ["Simulation", "simulate", "store_all_peak", "activation_budget_bytes"]



def simulate(graph: Graph, plan: Plan | None = None, *, record: bool = True) -> Simulation:
    """Walk the forward and backward of ``graph`` under ``plan``.

    Args:
        graph: the cost graph.
        plan: the checkpoint regions; ``None`` means store-all (no region).
        record: keep the per-step timeline (``steps``/``live_bytes``); turn off
            in inner loops.

    Returns:
        A :class:`Simulation` with the peak, where it happens, its breakdown,
        the timeline and the recompute cost.
    """
    traced = graph
    if plan is not None:
        plan.validate(graph)
        graph = expand(graph, plan.chunks)  # NOTE [ Chunked head ] in solvers.model.chunks
    if not record:
        for i, (ref, seen, sim) in enumerate(_RECENT):
            if ref() is graph and seen == _key(plan):
                _RECENT.append(_RECENT.pop(i))  # the most recent again
                return sim
    poll("simulating the step")  # a caller's stop check, where one is set (NOTE [ Reading a graph under a deadline ])
    if plan is not None and plan.inner:
        walk: Walk = NestedWalk(graph, plan, record)  # NOTE [ Nested regions ] in solvers.model.nested
    else:
        walk = Walk(graph, plan, record)
    poll("simulating the step's forward")
    walk.forward()
    poll("simulating the step's backward")
    walk.backward()
    sim = walk.result()
    if plan is not None and (graph_overheads(traced) is not None or plan.chunks and chunk_times(traced)):
        # see NOTE [ Plan overheads ]
        split = overhead_seconds(traced, plan.regions, plan.saved, plan.inner, plan.chunks)
        rate = graph_rate(traced)
        sim = dataclasses.replace(sim, overhead_s=split,
                                  overhead_cost=int(round(sum(split.values()) * rate)) if rate else 0)
    if not record:
        remember(graph, plan, sim)
    return sim


#: The last simulations without a timeline, by graph object and plan: ``solve`` re-costs the plan a
#: solver has just simulated (0.65 s on 100,000 nodes, inside the solver's time limit: NOTE [ One deadline ]
#: in ``solvers.deadline``). A graph is immutable, and a weak reference never outlives it.
_RECENT: list[tuple[weakref.ref, tuple, "Simulation"]] = []
_RECENT_SIZE = 4


def _key(plan: Plan | None) -> tuple:
    # chunks too: a chunked plan and its regions alone on the expanded graph differ in their overheads
    return (tuple(plan.regions), tuple(plan.saved), tuple(plan.inner), tuple(plan.chunks)) if plan is not None \
        else ((), (), (), ())


def remember(graph: Graph, plan: Plan | None, sim: Simulation) -> None:
    """Keep ``sim``, what ``simulate(graph, plan, record=False)`` returned, as the most recent simulation
    (a solver that simulated many plans puts the one it answers with last)."""
    key = _key(plan)
    _RECENT[:] = [e for e in _RECENT if not (e[0]() is graph and e[1] == key)]
    _RECENT.append((weakref.ref(graph), key, sim))
    del _RECENT[:-_RECENT_SIZE]


def store_all_peak(graph: Graph) -> Simulation:
    """The simulation without any region (everything autograd saves is kept)."""
    return simulate(graph, None, record=False)


def activation_budget_bytes(graph: Graph, fraction: float) -> int:
    """Whole-step budget meaning "``fraction`` of the store-all activations".

    Store-all's peak less ``(1 - fraction)`` of its activation peak (NOTE
    [ Fractional budgets ] in ``scheduler.sizing.budget``): ``fraction=1.0`` is
    exactly store-all's peak, every smaller fraction lies below it.
    """
    if not 0 < fraction <= 1:
        raise SolverInputError(f"fraction must lie in (0, 1], got {fraction!r}")
    sim = store_all_peak(graph)
    return int(sim.peak_bytes - math.ceil((1.0 - fraction) * sim.activation_peak_bytes))
