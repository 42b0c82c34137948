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
    [ Nested regions ] in ``solvers.nested`` around its outer regions'
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
from dataclasses import dataclass
from typing import Mapping

from graphs import COSTS_META, Graph
from graphs.reading import poll, poll_every

from ..chunks import expand
from ..errors import SolverInputError
from .gradients import GradientWalk
from .plan import Plan
from .meter import BACKWARD, FORWARD, RECOMPUTE, _Meter
from .overheads import graph_overheads, overhead_seconds
from .terms import region_rng_bytes, terms_of

__all__ = ["Simulation", "simulate", "store_all_peak", "activation_budget_bytes", "GradientWalk", "cost_seconds",
           "region_rng_bytes"]



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
        overhead_s: what the plan adds besides recompute, in seconds, by term (NOTE [ Plan
            overheads ] in ``solvers.model.overheads``); empty for store-all.
        overhead_cost: ``overhead_s`` in the solvers' units (seconds at the graph's rate).
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
    recompute_time_s: float | None = None
    overhead_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    overhead_cost: int = 0

    @property
    def total_cost(self) -> int:
        """What a plan adds to the step in the solvers' units: recompute plus overheads (NOTE [ Plan overheads ])."""
        return self.recompute_cost + self.overhead_cost

    @property
    def extra_time_s(self) -> float | None:
        """The predicted extra time of the step: recompute time plus overheads (None without a rate)."""
        if self.recompute_time_s is None:
            return None
        return self.recompute_time_s + sum(self.overhead_s.values())

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
    traced = graph
    if plan is not None:
        plan.validate(graph)
        graph = expand(graph, plan.chunks)  # NOTE [ Chunked head ] in solvers.chunks
    if not record:
        for i, (ref, seen, sim) in enumerate(_RECENT):
            if ref() is graph and seen == _key(plan):
                _RECENT.append(_RECENT.pop(i))  # the most recent again
                return sim
    poll("simulating the step")  # a caller's stop check, where one is set (NOTE [ Reading a graph under a deadline ])
    if plan is not None and plan.inner:
        from .nested_walk import NestedWalk  # NOTE [ Nested regions ] in solvers.nested
        walk: _Walk = NestedWalk(graph, plan, record)
    else:
        walk = _Walk(graph, plan, record)
    poll("simulating the step's forward")
    walk.forward()
    poll("simulating the step's backward")
    walk.backward()
    sim = walk.result()
    if plan is not None and graph_overheads(traced) is not None:  # NOTE [ Plan overheads ]
        split = overhead_seconds(traced, plan.regions, plan.saved, plan.inner, plan.chunks)
        rate = _rate(traced)
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


class _Walk:
    """One walk of NOTE [ Execution model ], in its phases: who holds what
    (``__init__``), the forward, the backward with each region's recompute."""

    def __init__(self, graph: Graph, plan: Plan | None, record: bool) -> None:
        self.graph = graph
        nodes = self.nodes = graph.nodes
        n = len(nodes)
        regions = self.regions = plan.regions if plan is not None else ()
        kept = self.kept = [False] * n  # NOTE [ Selective recompute ]
        for k in (plan.saved if plan is not None else ()):
            kept[k] = True
        region_of = self.region_of = [-1] * n
        for r, (a, b) in enumerate(regions):
            for i in range(a, b + 1):
                region_of[i] = r
        self.terms = terms_of(graph)
        # a stochastic region's first node -> the generator state it stores (NOTE [ RNG state per region ])
        self.rng_at = {a: rng for (a, _), rng in zip(regions, region_rng_bytes(graph, regions)) if rng}
        self.rng_fwd = self.rng_at  # what the forward stores at each position (inner regions add theirs)
        self.rg = [nd.requires_grad for nd in nodes]
        self.out_b = [nd.out_bytes for nd in nodes]
        self.caller = self.terms.sinks  # sinks and held outputs: the caller holds them to the end
        self._holders()
        self.meter = _Meter(graph, record)
        self.act = 0  # activations (outputs, saved buffers, recomputed copies)
        self.agrad = 0  # gradients of activations
        self.pgrad = 0  # gradients of parameters
        self.alive = [False] * n
        self.recompute_flops = 0
        self.recompute_cost = 0

    def _holders(self) -> None:
        """hold[j]: number of holders of the forward copy of tensor j;
        node_holds[k]: tensors (forward copies) node k releases after its backward;
        region_holds[r]: tensors region r releases after its backward."""
        n, preds, saves, region_of = len(self.nodes), self.graph.preds, self.terms.saves, self.region_of
        hold = self.hold = [0] * n
        node_holds: list[list[int]] = [[] for _ in range(n)]
        region_holds: list[list[int]] = [[] for _ in self.regions]
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
            if self.kept[k]:
                hold[k] += 1  # the region's cache (NOTE [ Selective recompute ])
        self.node_holds, self.region_holds = node_holds, region_holds

    # ------------------------------------------------------------- forward
    def forward(self) -> None:
        nodes, preds, succs = self.nodes, self.graph.preds, self.graph.succs
        out_b, hold, caller, alive, kept, rg, region_of = (self.out_b, self.hold, self.caller, self.alive, self.kept,
                                                            self.rg, self.region_of)
        step = self.meter.step
        act = self.act
        remaining = [len(s) for s in succs]
        every = poll_every()
        for i in range(len(nodes)):
            if every and not i % every:
                poll(f"simulating the step's forward (node {i:,} of {len(nodes):,})")
            nd = nodes[i]
            act += self.rng_fwd.get(i, 0)  # stored before the region runs, kept with its inputs
            act += out_b[i] + nd.saved_bytes
            alive[i] = True
            step(FORWARD, i, act, self.agrad, self.pgrad, nd.workspace_bytes)
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
        self.act = act

    # ------------------------------------------------------------ backward
    def backward(self) -> None:
        graph, n = self.graph, len(self.nodes)
        self.pgrad += graph.unattributed_grad_bytes()  # trained, not attributed to a node
        grads = self.grads = GradientWalk(graph)
        grads.start()
        self.agrad = grads.bytes
        regions = self.regions
        region_last = {b: r for r, (a, b) in enumerate(regions)}
        region_first = {a: r for r, (a, b) in enumerate(regions)}
        self.span_extra = graph.span_extra_bytes()
        self.costs = graph.recompute_costs()
        self.rec_hold = [0] * n  # holders of recomputed copies
        self.rec_node_holds: list[list[int]] = [[] for _ in range(n)]
        # shared[k]: k's recomputed copy is its forward copy's storage, counted
        # once under the forward copy (NOTE [ Selective recompute ]).
        self.shared = [False] * n
        every = poll_every()
        for i in range(n - 1, -1, -1):
            if every and not i % every:
                poll(f"simulating the step's backward (node {i:,} of {n:,})")
            if i in region_last:
                self._recompute(*regions[region_last[i]])
            if self.rg[i]:
                self._node_backward(i)
            if i in region_first:
                self.act -= self.rng_at.get(i, 0)
                for j in self.region_holds[region_first[i]]:
                    self._release(j)

    def _release(self, j: int) -> None:
        """One holder of the forward copy of ``j`` lets go."""
        self.hold[j] -= 1
        if self.hold[j] == 0 and self.alive[j] and not self.caller[j]:
            self.alive[j] = False
            if self.shared[j]:
                self.shared[j] = False  # the recomputed copy owns the storage now
            else:
                self.act -= self.out_b[j]

    def _drop_recomputed(self, j: int) -> None:
        if self.shared[j]:
            self.shared[j] = False  # the forward copy still holds the storage
        else:
            self.act -= self.out_b[j]

    def _recompute(self, a: int, b: int) -> None:
        """Region ``[a, b]`` recomputed from its inputs when the backward reaches ``b``."""
        nodes, preds, saves, caller, kept = self.nodes, self.graph.preds, self.terms.saves, self.caller, self.kept
        rec_hold, hold = self.rec_hold, self.hold
        step = self.meter.step
        rem = [0] * (b - a + 1)
        for k in range(a, b + 1):
            for j in dict.fromkeys(preds[k]):
                if a <= j <= b:
                    rem[j - a] += 1
            for j in saves[k]:
                if a <= j <= b:
                    rec_hold[j] += 1
                    self.rec_node_holds[k].append(j)
        # The region's outputs (read after it, or by the caller) stay
        # referenced by the running region until its recompute ends.
        outs = [caller[k] or self.terms.last_reader[k] > b for k in range(a, b + 1)]
        snapshot = sum(nodes[k].state_bytes for k in range(a, b + 1))  # buffers copied around the recompute
        snapshot += self.span_extra.get((a, b), 0)  # what the call's eager locals hold (eager lifetimes)
        snapshot += self.rng_at.get(a, 0)  # fork_rng's copy of the current generator state
        self.act += snapshot
        for k in range(a, b + 1):
            nd = nodes[k]
            if kept[k]:  # NOTE [ Selective recompute ]: the cache's tensors become the copy
                hold[k] -= 1
                if hold[k] == 0 and not caller[k]:
                    self.alive[k] = False  # its storage passes to the recomputed copy
                else:
                    self.shared[k] = True
                step(RECOMPUTE, k, self.act, self.agrad, self.pgrad, 0)
            else:
                self.recompute_flops += nd.fwd_flops
                self.recompute_cost += self.costs[k]
                self.act += self.out_b[k] + nd.saved_bytes
                step(RECOMPUTE, k, self.act, self.agrad, self.pgrad, nd.workspace_bytes)
            if not self.rg[k]:
                self.act -= nd.saved_bytes
            for j in dict.fromkeys(preds[k]):
                if a <= j <= b:
                    rem[j - a] -= 1
                    if rem[j - a] == 0 and rec_hold[j] == 0 and not outs[j - a]:
                        self._drop_recomputed(j)
            if rem[k - a] == 0 and rec_hold[k] == 0 and not outs[k - a]:
                self._drop_recomputed(k)
        for k in range(a, b + 1):
            if outs[k - a] and rec_hold[k] == 0:
                self._drop_recomputed(k)
        self.act -= snapshot

    def _node_backward(self, i: int) -> None:
        nd, grads = self.nodes[i], self.grads
        transient = grads.node_backward(i)
        self.agrad = grads.bytes
        self.pgrad += nd.param_bytes
        self.meter.step(BACKWARD, i, self.act, self.agrad, self.pgrad, transient)
        grads.node_done(i)
        self.agrad = grads.bytes
        self.act -= nd.saved_bytes  # own saved buffers (kept whether in a region or not; rg here)
        for j in self.node_holds[i]:
            self._release(j)
        for j in self.rec_node_holds[i]:
            self.rec_hold[j] -= 1
            if self.rec_hold[j] == 0:
                self._drop_recomputed(j)

    # -------------------------------------------------------------- result
    def result(self) -> Simulation:
        graph, meter = self.graph, self.meter
        phase, node_i = meter.best_at
        return Simulation(
            peak_bytes=meter.best,
            peak_step=meter.best_step,
            peak_phase=phase,
            peak_node=self.nodes[node_i].name,
            breakdown=meter.best_break,
            steps=tuple(meter.steps),
            live_bytes=tuple(meter.live),
            recompute_flops=self.recompute_flops,
            step_flops=graph.total_fwd_flops() + graph.total_bwd_flops(),
            recompute_cost=self.recompute_cost,
            activation_peak_bytes=meter.act_peak,
            recompute_time_s=cost_seconds(graph, self.recompute_cost),
        )


def _rate(graph: Graph) -> float | None:
    costs = graph.meta.get(COSTS_META)
    rate = costs.get("flops_per_s") if isinstance(costs, Mapping) else None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        return None
    return float(rate)


def cost_seconds(graph: Graph, cost: int) -> float | None:
    """``cost`` (FLOP-equivalents) in seconds at ``graph.meta["costs"]["flops_per_s"]``; None without a rate."""
    rate = _rate(graph)
    return None if rate is None else cost / rate


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
