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
        node saves ] in ``graphs.graph``); inside a region nothing is saved:
        own buffers are freed at once and tensors die after their last
        forward consumer;
      * a region holds its *inputs* (tensors produced before the region, or in
        another region, and read inside it) until its backward is done;
      * a tensor is freed after its last forward consumer when no node, region
        or the caller holds it. Outputs nobody consumes (the loss, returned
        logits) are held by the caller to the end of the step.

    Backward, nodes in reverse order (only nodes with ``requires_grad``):
      * at the start, gradients of parameters not attributed to a node and the
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

import math
from dataclasses import dataclass, field
from typing import Mapping

from graphs import COSTS_META, Graph

from .errors import SolverInputError
from .gradients import GradientWalk
from .plan import Plan

__all__ = ["Simulation", "simulate", "store_all_peak", "activation_budget_bytes", "GradientWalk", "cost_seconds",
           "region_rng_bytes"]

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"


@dataclass(frozen=True)
class Simulation:
    """Result of :func:`simulate`.

    Attributes:
        peak_bytes: the highest live bytes of the step (all categories).
        peak_step: index into ``steps`` where the peak happens (first one).
        peak_phase: ``forward``, ``recompute`` or ``backward``.
        peak_node: name of the node running at the peak.
        breakdown: live bytes per category at the peak: ``params``,
            ``inputs``, ``activations`` (outputs and saved buffers, including
            recomputed copies), ``activation_grads``, ``param_grads``,
            ``workspace`` (transients of the running step).
        steps: ``(phase, node_index)`` for every step, in execution order.
        live_bytes: total live bytes at every step (same length as ``steps``).
        recompute_flops: FLOPs of recomputation the plan adds.
        recompute_cost: what the solvers minimise (``Graph.recompute_costs``)
            summed over the recomputed nodes; equals ``recompute_flops`` on a
            graph costed in FLOPs.
        step_flops: FLOPs of the step without checkpointing (forward + backward).
        recompute_time_s: ``recompute_cost`` in seconds (:func:`cost_seconds`);
            None when the graph has no rate (graphs costed before rates).
        activation_peak_bytes: highest live bytes excluding parameters, inputs
            and parameter gradients (the quantity a fraction budget refers to).
    """

    peak_bytes: int
    peak_step: int
    peak_phase: str
    peak_node: str
    breakdown: Mapping[str, int]
    steps: tuple[tuple[str, int], ...]
    live_bytes: tuple[int, ...]
    recompute_flops: int
    step_flops: int
    recompute_cost: int
    activation_peak_bytes: int
    persistent_bytes: int = field(default=0)
    recompute_time_s: float | None = None

    @property
    def recompute_ratio(self) -> float:
        """Recompute FLOPs as a fraction of the un-checkpointed step's FLOPs."""
        return self.recompute_flops / self.step_flops if self.step_flops else 0.0


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
    nodes = graph.nodes
    n = len(nodes)
    regions = plan.regions if plan is not None else ()
    if plan is not None:
        plan.validate(graph)
    kept = [False] * n  # NOTE [ Selective recompute ]
    for k in (plan.saved if plan is not None else ()):
        kept[k] = True
    region_of = [-1] * n
    for r, (a, b) in enumerate(regions):
        for i in range(a, b + 1):
            region_of[i] = r
    rng_of = region_rng_bytes(graph, regions)  # NOTE [ RNG state per region ]
    preds = graph.preds
    succs = graph.succs
    idx = graph.index
    rg = [nd.requires_grad for nd in nodes]
    out_b = [nd.out_bytes for nd in nodes]
    own_b = [nd.saved_bytes if nd.requires_grad else 0 for nd in nodes]
    # Distinct tensors each node saves (as node positions).
    saves = []
    for i, nd in enumerate(nodes):
        s = []
        if rg[i]:
            for name in nd.saves_inputs:
                j = idx[name]
                if j not in s:
                    s.append(j)
            if nd.saves_output and i not in s:
                s.append(i)
        saves.append(s)

    # ------------------------------------------------------------- holders
    # hold[j]: number of holders of the forward copy of tensor j.
    # node_holds[k]: tensors (forward copies) node k releases after its backward.
    # region_holds[r]: tensors region r releases after its backward.
    hold = [0] * n
    node_holds: list[list[int]] = [[] for _ in range(n)]
    region_holds: list[list[int]] = [[] for _ in regions]
    for k in range(n):
        if region_of[k] == -1:
            for j in saves[k]:
                hold[j] += 1
                node_holds[k].append(j)
        else:
            r = region_of[k]
            for j in dict.fromkeys(preds[k]):
                if region_of[j] != r and j not in region_holds[r]:
                    region_holds[r].append(j)
                    hold[j] += 1
    for k in range(n):
        if kept[k]:
            hold[k] += 1  # the region's cache (NOTE [ Selective recompute ])
    caller = [not succs[j] for j in range(n)]  # sinks are held by the caller to the end

    params = graph.param_bytes
    inputs = graph.input_bytes
    base = params + inputs
    attributed = sum(nd.param_bytes for nd in nodes)
    unattributed_pgrad = max(0, params - attributed)

    act = 0  # activations (outputs, saved buffers, recomputed copies)
    agrad = 0  # gradients of activations
    pgrad = 0  # gradients of parameters

    steps: list[tuple[str, int]] = []
    live: list[int] = []
    best = -1
    best_step = 0
    best_break: dict[str, int] = {}
    act_peak = 0

    def record_step(phase: str, i: int, transient: int) -> None:
        nonlocal best, best_step, best_break, act_peak
        total = base + act + agrad + pgrad + transient
        a_only = act + agrad + transient
        if a_only > act_peak:
            act_peak = a_only
        if total > best:
            best = total
            best_step = len(live) if record else 0
            best_break = {
                "params": params, "inputs": inputs, "activations": act, "activation_grads": agrad,
                "param_grads": pgrad, "workspace": transient, "_phase": phase, "_node": i,  # type: ignore[dict-item]
            }
        if record:
            steps.append((phase, i))
            live.append(total)

    # ------------------------------------------------------------- forward
    remaining = [len(succs[j]) for j in range(n)]
    alive = [False] * n
    for i in range(n):
        nd = nodes[i]
        if region_of[i] != -1 and regions[region_of[i]][0] == i:
            act += rng_of[region_of[i]]  # stored before the region runs, kept with its inputs
        act += out_b[i] + nd.saved_bytes
        alive[i] = True
        record_step(FORWARD, i, nd.workspace_bytes)
        if (region_of[i] != -1 or not rg[i]) and not kept[i]:
            act -= nd.saved_bytes  # own buffers not kept
        for j in dict.fromkeys(preds[i]):
            remaining[j] -= 1
            if remaining[j] == 0 and hold[j] == 0 and not caller[j]:
                act -= out_b[j]
                alive[j] = False
        if remaining[i] == 0 and hold[i] == 0 and not caller[i]:
            act -= out_b[i]  # nothing reads or keeps it
            alive[i] = False

    # ------------------------------------------------------------ backward
    pgrad += unattributed_pgrad
    grads = GradientWalk(graph)
    grads.start()
    agrad = grads.bytes
    region_last = {b: r for r, (a, b) in enumerate(regions)}
    span_extra = graph.span_extra_bytes()
    region_first = {a: r for r, (a, b) in enumerate(regions)}
    rec_hold = [0] * n  # holders of recomputed copies
    rec_node_holds: list[list[int]] = [[] for _ in range(n)]
    recompute_flops = 0
    recompute_cost = 0
    costs = graph.recompute_costs()

    # shared[k]: k's recomputed copy is its forward copy's storage, counted
    # once under the forward copy (NOTE [ Selective recompute ]).
    shared = [False] * n

    def release(j: int) -> None:
        nonlocal act
        hold[j] -= 1
        if hold[j] == 0 and alive[j] and not caller[j]:
            alive[j] = False
            if shared[j]:
                shared[j] = False  # the recomputed copy owns the storage now
            else:
                act -= out_b[j]

    def drop_recomputed(j: int) -> None:
        nonlocal act
        if shared[j]:
            shared[j] = False  # the forward copy still holds the storage
        else:
            act -= out_b[j]

    for i in range(n - 1, -1, -1):
        if i in region_last:
            r = region_last[i]
            a, b = regions[r]
            # Recompute the region from its inputs.
            rem = [0] * (b - a + 1)
            for k in range(a, b + 1):
                for j in dict.fromkeys(preds[k]):
                    if a <= j <= b:
                        rem[j - a] += 1
                for j in saves[k]:
                    if a <= j <= b:
                        rec_hold[j] += 1
                        rec_node_holds[k].append(j)
            # The region's outputs (read after it, or by the caller) stay
            # referenced by the running region until its recompute ends.
            outs = [caller[k] or succs[k][-1] > b for k in range(a, b + 1)]
            snapshot = sum(nodes[k].state_bytes for k in range(a, b + 1))  # buffers copied around the recompute
            snapshot += span_extra.get((a, b), 0)  # what the call's eager locals hold (eager lifetimes)
            snapshot += rng_of[r]  # fork_rng's copy of the current generator state
            act += snapshot
            for k in range(a, b + 1):
                nd = nodes[k]
                if kept[k]:  # NOTE [ Selective recompute ]: the cache's tensors become the copy
                    hold[k] -= 1
                    if hold[k] == 0 and not caller[k]:
                        alive[k] = False  # its storage passes to the recomputed copy
                    else:
                        shared[k] = True
                    record_step(RECOMPUTE, k, 0)
                else:
                    recompute_flops += nd.fwd_flops
                    recompute_cost += costs[k]
                    act += out_b[k] + nd.saved_bytes
                    record_step(RECOMPUTE, k, nd.workspace_bytes)
                if not rg[k]:
                    act -= nd.saved_bytes
                for j in dict.fromkeys(preds[k]):
                    if a <= j <= b:
                        rem[j - a] -= 1
                        if rem[j - a] == 0 and rec_hold[j] == 0 and not outs[j - a]:
                            drop_recomputed(j)
                if rem[k - a] == 0 and rec_hold[k] == 0 and not outs[k - a]:
                    drop_recomputed(k)
            for k in range(a, b + 1):
                if outs[k - a] and rec_hold[k] == 0:
                    drop_recomputed(k)
            act -= snapshot
        if rg[i]:
            nd = nodes[i]
            transient = grads.node_backward(i)
            agrad = grads.bytes
            pgrad += nd.param_bytes
            record_step(BACKWARD, i, transient)
            grads.node_done(i)
            agrad = grads.bytes
            act -= own_b[i]  # own saved buffers (kept whether in a region or not)
            for j in node_holds[i]:
                release(j)
            for j in rec_node_holds[i]:
                rec_hold[j] -= 1
                if rec_hold[j] == 0:
                    drop_recomputed(j)
        if i in region_first:
            act -= rng_of[region_first[i]]
            for j in region_holds[region_first[i]]:
                release(j)

    phase = best_break.pop("_phase")  # type: ignore[arg-type]
    node_i = best_break.pop("_node")  # type: ignore[arg-type]
    return Simulation(
        peak_bytes=best,
        peak_step=best_step,
        peak_phase=phase,  # type: ignore[arg-type]
        peak_node=nodes[node_i].name,  # type: ignore[index]
        breakdown=best_break,
        steps=tuple(steps),
        live_bytes=tuple(live),
        recompute_flops=recompute_flops,
        step_flops=graph.total_fwd_flops() + graph.total_bwd_flops(),
        recompute_cost=recompute_cost,
        activation_peak_bytes=act_peak,
        persistent_bytes=base + params,
        recompute_time_s=cost_seconds(graph, recompute_cost),
    )


def region_rng_bytes(graph: Graph, regions) -> list[int]:  # noqa: ANN001
    """Per region, the generator state it stores: ``graph.rng_state_bytes`` when a node in it is
    stochastic, else 0 (NOTE [ RNG state per region ])."""
    rng = graph.rng_state_bytes
    if not rng:
        return [0] * len(regions)
    nodes = graph.nodes
    return [rng if any(nodes[k].stochastic for k in range(a, b + 1)) else 0 for a, b in regions]


def cost_seconds(graph: Graph, cost: int) -> float | None:
    """``cost`` (FLOP-equivalents) in seconds at ``graph.meta["costs"]["flops_per_s"]``; None without a rate."""
    costs = graph.meta.get(COSTS_META)
    rate = costs.get("flops_per_s") if isinstance(costs, Mapping) else None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        return None
    return cost / rate


def store_all_peak(graph: Graph) -> Simulation:
    """The simulation without any region (everything autograd saves is kept)."""
    return simulate(graph, None, record=False)


def activation_budget_bytes(graph: Graph, fraction: float) -> int:
    """Whole-step budget meaning "``fraction`` of the store-all activations".

    Store-all's peak less ``(1 - fraction)`` of its activation peak (NOTE
    [ Fractional budgets ] in ``scheduler.budget``): ``fraction=1.0`` is
    exactly store-all's peak, every smaller fraction lies below it.
    """
    if not 0 < fraction <= 1:
        raise SolverInputError(f"fraction must lie in (0, 1], got {fraction!r}")
    sim = store_all_peak(graph)
    return int(sim.peak_bytes - math.ceil((1.0 - fraction) * sim.activation_peak_bytes))
