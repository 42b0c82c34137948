"""One walk of the execution model (NOTE [ Execution model ] in ``solvers.model.simulate``), one level deep, and
what it returns: who holds what, the forward, the backward with each region's recompute, measured by the
step meter. ``solvers.model.nested_walk`` extends it with nested regions; ``simulate`` runs either.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

from graphs import COSTS_META, Graph
from graphs.reading import poll, poll_every

from .gradients import GradientWalk
from .meter import BACKWARD, FORWARD, RECOMPUTE, _Meter
from .plan import Plan
from .terms import region_rng_bytes, terms_of

__all__ = ["Walk", "Simulation", "cost_seconds", "graph_rate"]


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


class Walk:
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
        # per node, the Python scalars its recomputed autograd node holds to the recompute's end; charged in an
        # inner region's recompute only (NOTE [ Nested regions ] in solvers.model.nested), None elsewhere
        self.rec_scalars: list[int] | None = None

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
        region_last, region_first = self._start_backward()
        n, every = len(self.nodes), poll_every()
        for i in range(n - 1, -1, -1):
            if every and not i % every:
                poll(f"simulating the step's backward (node {i:,} of {n:,})")
            if i in region_last:
                self._recompute(*self.regions[region_last[i]])
            self._node_step(i, region_first)

    def _start_backward(self) -> tuple[dict[int, int], dict[int, int]]:
        """The backward's state before its first step; returns the regions by their last and first nodes."""
        graph, n = self.graph, len(self.nodes)
        self.pgrad += graph.unattributed_grad_bytes()  # trained, not attributed to a node
        grads = self.grads = GradientWalk(graph)
        grads.start()
        self.agrad = grads.bytes
        self.span_extra = graph.span_extra_bytes()
        self.costs = graph.recompute_costs()
        self.rec_hold = [0] * n  # holders of recomputed copies
        self.rec_node_holds: list[list[int]] = [[] for _ in range(n)]
        # shared[k]: k's recomputed copy is its forward copy's storage, counted
        # once under the forward copy (NOTE [ Selective recompute ]).
        self.shared = [False] * n
        regions = self.regions
        return {b: r for r, (a, b) in enumerate(regions)}, {a: r for r, (a, b) in enumerate(regions)}

    def _node_step(self, i: int, region_first: dict[int, int]) -> None:
        """Node ``i``'s backward; at a region's first node, the region lets go of its inputs and generator state."""
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
                if self.rec_scalars is not None and self.rec_scalars[k]:
                    snapshot += self.rec_scalars[k]  # released with the snapshot, as the recompute ends
                    self.act += self.rec_scalars[k]
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


def graph_rate(graph: Graph) -> float | None:
    """``graph.meta["costs"]["flops_per_s"]``, the rate a cost is in seconds at; None without one."""
    costs = graph.meta.get(COSTS_META)
    rate = costs.get("flops_per_s") if isinstance(costs, Mapping) else None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        return None
    return float(rate)


def cost_seconds(graph: Graph, cost: int) -> float | None:
    """``cost`` (FLOP-equivalents) in seconds at ``graph.meta["costs"]["flops_per_s"]``; None without a rate."""
    rate = graph_rate(graph)
    return None if rate is None else cost / rate
