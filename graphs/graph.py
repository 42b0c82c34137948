"""The cost-annotated compute graph every part of the project shares.

A :class:`Graph` is a DAG whose nodes are stored in one fixed topological order
(the order ``torch.fx`` records them in). Each :class:`Node` carries what the
solvers and the simulator need: FLOPs, the bytes of its output, and exactly
which tensors autograd keeps alive for its backward.

The node type and NOTE [ What a node saves ] live in ``graphs.node``; the
spans a plan may use, NOTE [ Module-aligned regions ], on :class:`Span` here.

This module imports nothing from torch; graphs can be built by hand, loaded
from JSON, or produced by the tracer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import GraphError
from .node import Node, toposort
from .reading import poll, poll_every
from .schema import (BUILD_META, CALL_RETURNS_META, COSTS_META, FORMAT_VERSION, FROZEN_META, FUSED_HEADS_META, GRAPH_KEYS, HOLDS_OP, LM_HEADS_META, LOOPS, MAX_COUNT, SCALARS_META,
                     TARGET_META, WORKSPACES_META, short_repr, count, is_count, reject_unknown)

__all__ = ["Span", "Graph", "graph_from_dict"]


@dataclass(frozen=True)
class Span:
    """A run of nodes that the user's module executes as one submodule call.

    NOTE [ Module-aligned regions ]
        A plan is applied onto the user's own module by checkpointing
        submodule calls (hooks on the submodule; the user's forward runs as
        written). Only a region that covers exactly the nodes of one such
        call can be lowered that way, so a traced graph lists those calls as
        spans, and when :attr:`Graph.spans` is non-empty every solver
        chooses regions among them only (``(first, last)`` equal to some
        span's). ``Graph.unaligned()`` drops the restriction (plans for the
        graph-level fallback applier). The spans need not nest: a run of
        consecutive children of an ``nn.Sequential`` is a span too.

    Attributes:
        first: position of the call's first node.
        last: position of its last node (inclusive).
        module: dotted path of the submodule in the user's model (``h.3``,
            ``encoder.layer.2.attention``); ``seq[2:5]`` names the run of
            children 2, 3, 4 of the ``nn.Sequential`` at path ``seq``.
        extra_bytes: bytes the call's own Python code keeps referenced beyond
            the graph's lifetimes while it runs (NOTE [ Eager lifetimes in a
            recompute ] in ``scheduler.tracing.eager_lifetimes``): a region
            equal to this span holds them during its recompute, and
            ``solvers.model.simulate`` adds them to every step of that recompute.
    """

    first: int
    last: int
    module: str
    extra_bytes: int = 0

    def to_list(self) -> list:
        return [self.first, self.last, self.module] + ([self.extra_bytes] if self.extra_bytes else [])


@dataclass(frozen=True)
class Graph:
    """A cost-annotated DAG, nodes in topological order.

    NOTE [ The user's loop ]
        What the caller holds during the backward depends on how the training
        loop is written. ``out = model(**batch); out.loss.backward()`` keeps
        ``out`` (logits, hidden states, a returned cache) referenced until the
        backward returns; ``loss = model(**batch).loss; loss.backward()`` and
        ``Trainer`` drop it first, and each tensor of ``out`` is freed after its
        last reader like any other. :attr:`outputs` names the nodes whose
        storages the model's return value holds (with ``loss=``, the model's
        own return, not the loss), and :attr:`loop` says which loop the graph
        is planned for:

        * ``"held"`` (the default, the conservative one): every output is held
          by the caller from its forward step to the end of the step, like a
          sink (an output nobody reads, the loss); a plan that fits it also
          fits a loop that drops the output;
        * ``"dropped"``: outputs are freed after their last reader, held only
          when nothing reads them (sinks are held in both loops).

        Under a region, the caller holds the region's forward copy of an
        output; the recompute makes a copy of its own, freed as any recomputed
        region output is (``solvers.model.simulate``, NOTE [ Execution model ]).
        A graph with no outputs (hand-built, synthetic, or written before
        they were recorded) reads the same under both loops.

    Attributes:
        nodes: the nodes, each after all of its inputs.
        param_bytes: bytes of all parameters of the model (always live).
            Gradients of parameters neither frozen nor attributed to a node
            (:meth:`unattributed_grad_bytes`) are created at the start of the
            backward.
        frozen_param_bytes: bytes of the parameters that get no gradient
            (``requires_grad=False``: a frozen base under adapters, frozen
            layers), part of ``param_bytes``; 0 (the default, and in files
            without the field): every parameter is trained.
        input_bytes: bytes of the model's inputs (always live).
        name: a label (model name), informative.
        meta: free-form description of what was traced (model, input shapes,
            dtype); part of the fingerprint, so a plan solved for batch 8 is
            not applied at batch 16.
        spans: the regions a plan may use when it must be applied onto the
            user's module (NOTE [ Module-aligned regions ]); empty: any
            interval. Sorted by ``(first, -last)``, one span per interval
            (the outermost module when several calls cover the same nodes).
        rng_state_bytes: bytes of the generator state a checkpoint region
            that draws random numbers stores (``preserve_rng_state``: the CPU
            generator's state, and each CUDA device's in use), held from the
            region's forward until its backward is done, and once more while
            it recomputes (NOTE [ RNG state per region ] in
            ``solvers.model.terms``); 0 (the default, and in files without the
            field): not counted.
    """

    nodes: tuple[Node, ...]
    param_bytes: int = 0
    input_bytes: int = 0
    rng_state_bytes: int = 0
    frozen_param_bytes: int = 0
    name: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    spans: tuple[Span, ...] = ()
    outputs: tuple[str, ...] = ()
    loop: str = "held"

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "outputs", tuple(dict.fromkeys(self.outputs)))
        object.__setattr__(self, "meta", dict(self.meta))
        object.__setattr__(self, "spans", _normalise_spans(self.spans))
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check names are unique, edges point backwards, sizes are sane.

        Raises:
            GraphError: naming the offending node and field.
        """
        if not self.nodes:
            raise GraphError("graph has no nodes; a graph needs at least one node")
        for key in ("param_bytes", "input_bytes", "rng_state_bytes", "frozen_param_bytes"):
            v = getattr(self, key)
            if not is_count(v):
                raise GraphError(f"graph field {key!r} must be an integer in [0, 2**62), got {v!r}")
        if self.frozen_param_bytes > self.param_bytes:
            raise GraphError(f"graph field 'frozen_param_bytes' ({self.frozen_param_bytes}) exceeds 'param_bytes' "
                             f"({self.param_bytes}); frozen parameters are some of the parameters")
        index: dict[str, int] = {}
        names = {n.name for n in self.nodes}
        every = poll_every()  # NOTE [ Reading a graph under a deadline ] in graphs.reading
        counts_of = operator.attrgetter(*Node._INT_FIELDS)
        for i, node in enumerate(self.nodes):
            if every and i % every == 0:
                poll(f"checking the graph ({i:,} of {len(self.nodes):,} nodes)")
            if node.name in index:
                raise GraphError(f"node {node.name!r} appears twice (positions {index[node.name]} and {i})")
            for src in node.inputs:
                if src not in names:
                    raise GraphError(f"node {node.name!r}: input {src!r} is not a node of the graph")
                if src == node.name:
                    raise GraphError(f"node {node.name!r} lists itself as an input (a cycle)")
            for src in node.saves_inputs:
                if src not in node.inputs:
                    raise GraphError(
                        f"node {node.name!r}: saves_inputs names {src!r}, which is not one of its inputs {list(node.inputs)}"
                    )
            counts = counts_of(node)  # all plain ints in range (fast), or each field checked and named
            if not ({int} >= set(map(type, counts)) and min(counts) >= 0 and max(counts) < MAX_COUNT):
                for key, v in zip(Node._INT_FIELDS, counts):
                    if not is_count(v):
                        raise GraphError(f"node {node.name!r}: field {key!r} must be an integer in [0, 2**62), "
                                         f"got {v!r}")
            index[node.name] = i
        if every:
            poll("checking the graph's totals")
        nbytes = 2 * self.param_bytes + self.input_bytes + sum(
            nd.out_bytes + nd.saved_bytes + nd.workspace_bytes + nd.param_bytes + nd.state_bytes for nd in self.nodes)
        nflops = sum(nd.fwd_flops + nd.bwd_flops + nd.fwd_cost for nd in self.nodes)
        for what, total in (("byte", nbytes), ("FLOP", nflops)):
            if total >= MAX_COUNT:
                raise GraphError(f"the graph's {what} counts add up to {total:.4g}, not below 2**62; "
                                 "no real step is that large (a unit mix-up?)")
        if self.loop not in LOOPS:
            raise GraphError(f"graph field 'loop' must be one of {', '.join(map(repr, LOOPS))}, got {self.loop!r}")
        for name in self.outputs:
            if not isinstance(name, str) or name not in index:
                raise GraphError(f"graph field 'outputs' names {name!r}, which is not a node of the graph")
        n = len(self.nodes)
        for sp in self.spans:
            if not (0 <= sp.first <= sp.last < n):
                raise GraphError(f"span {sp.to_list()!r} is out of range: need 0 <= first <= last < {n}")
        for i, node in enumerate(self.nodes):
            if every and i % every == 0:
                poll(f"checking the graph's order ({i:,} of {len(self.nodes):,} nodes)")
            for src in node.inputs:
                if index[src] >= i:
                    raise GraphError(
                        f"node {node.name!r} reads {src!r}, which comes later in the order: "
                        "the nodes are not in topological order"
                    )

    # --------------------------------------------------------------- accessors
    def __len__(self) -> int:
        return len(self.nodes)

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, computed on the first call with ``key`` and kept on this graph.

        For tables derived from the graph alone (positions, edges, the
        solvers' execution-model terms): a graph is immutable, and
        ``dataclasses.replace`` builds a new one that derives its own.
        """
        value = self.__dict__.get(key)
        if value is None:
            value = make()
            object.__setattr__(self, key, value)
        return value

    @property
    def index(self) -> dict[str, int]:
        """Node name -> position in the topological order."""
        return self.cached("_index", lambda: {n.name: i for i, n in enumerate(self.nodes)})

    @property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the positions of its inputs."""
        idx = self.index
        return self.cached("_preds", lambda: tuple(tuple(idx[s] for s in n.inputs) for n in self.nodes))

    @property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the positions of its consumers (ascending)."""
        return self.cached("_succs", self._consumers)

    def _consumers(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for i, ps in enumerate(self.preds):
            for p in dict.fromkeys(ps):
                out[p].append(i)
        return tuple(tuple(s) for s in out)

    @property
    def aligned(self) -> bool:
        """Whether plans are restricted to :attr:`spans` (NOTE [ Module-aligned regions ])."""
        return bool(self.spans)

    def allowed_regions(self) -> frozenset[tuple[int, int]] | None:
        """The ``(first, last)`` intervals a plan may use, or None for any interval."""
        if not self.spans:
            return None
        return self.cached("_allowed", lambda: frozenset((sp.first, sp.last) for sp in self.spans))

    def span_module(self, region: Sequence[int]) -> str:
        """The module path of the span equal to ``region``, or "" when none is."""
        names = self.cached("_span_names", lambda: {(sp.first, sp.last): sp.module for sp in self.spans})
        return names.get((int(region[0]), int(region[1])), "")

    def span_extra_bytes(self) -> Mapping[tuple[int, int], int]:
        """``(first, last) -> extra_bytes`` of the spans whose ``extra_bytes`` are
        positive: a region equal to one holds them during its recompute (:class:`Span`)."""
        return self.cached("_span_extra", lambda: {(sp.first, sp.last): sp.extra_bytes
                                                   for sp in self.spans if sp.extra_bytes})

    def unattributed_grad_bytes(self) -> int:
        """Gradient bytes of the trained parameters no node is given (``Node.param_bytes``): created at
        the start of the backward (NOTE [ Execution model ] in ``solvers.model.simulate``); frozen ones get none."""
        return max(0, self.param_bytes - self.frozen_param_bytes - sum(nd.param_bytes for nd in self.nodes))

    def held_outputs(self) -> tuple[int, ...]:
        """Positions of the outputs the caller holds to the end of the step (NOTE [ The user's loop ]):
        :attr:`outputs` under the ``"held"`` loop, none under ``"dropped"``."""
        if self.loop != "held":
            return ()
        return self.cached("_held", lambda: tuple(sorted(self.index[name] for name in self.outputs)))

    def with_loop(self, loop: str) -> "Graph":
        """The same graph planned for another loop (NOTE [ The user's loop ])."""
        return self if loop == self.loop else dataclasses.replace(self, loop=loop)

    def unaligned(self) -> "Graph":
        """The same graph with no span restriction: plans may use any interval. Its ``holds`` nodes read nothing:
        the graph-level applier runs the traced fx graph, not the user's Python, and its values die at their
        last use (NOTE [ Forward holds ] in ``scheduler.tracing.forward_holds``)."""
        if not any(nd.op == HOLDS_OP and nd.inputs for nd in self.nodes):
            return dataclasses.replace(self, spans=()) if self.spans else self
        nodes = tuple(dataclasses.replace(nd, inputs=(), saves_inputs=()) if nd.op == HOLDS_OP else nd
                      for nd in self.nodes)
        return dataclasses.replace(self, spans=(), nodes=nodes)

    def recompute_costs(self) -> list[int]:
        """What recomputing each node costs, the quantity every solver minimises.

        The one place the objective is read from: each node's ``fwd_cost``
        (its FLOPs unless the tracer priced it otherwise, ``meta["costs"]``).
        """
        return [nd.fwd_cost for nd in self.nodes]

    @property
    def saveable(self) -> list[bool]:
        """Per node: whether a selective-checkpoint policy can keep its output (``sac_op >= 0``)."""
        return [nd.sac_op >= 0 for nd in self.nodes]

    def total_fwd_flops(self) -> int:
        return sum(n.fwd_flops for n in self.nodes)

    def total_bwd_flops(self) -> int:
        return sum(n.bwd_flops for n in self.nodes if n.requires_grad)

    def fingerprint(self) -> str:
        """A short hash of everything a plan's meaning depends on (structure, sizes, meta).

        Two traces of the same model with the same input shapes and dtype give
        the same fingerprint; a different model, shape or dtype does not. The
        costs (``fwd_flops``, ``bwd_flops``, ``fwd_cost`` and ``meta["costs"]``) and the
        kernel workspaces (``workspace_bytes``, ``meta["workspaces"]``: measured
        only on request) and the target's name (``meta["target"]``: the bytes its
        kernels save are counted) are left out: they change which plan is cheapest or
        fits, not what a plan does, and measurements differ from one trace to
        the next. :meth:`content_hash` covers everything.
        """
        return self.cached("_fingerprint", self._fingerprint)

    def _fingerprint(self) -> str:
        d = self.to_dict()
        for nd in d["nodes"]:
            if nd.get("op") == HOLDS_OP:  # what the user's Python holds: memory accounting (NOTE [ Forward holds ])
                nd["inputs"], nd["saves_inputs"] = [], []
        d.pop("spans", None)  # which regions can be lowered onto modules, not what a plan does
        d.pop("rng_state_bytes", None)  # memory accounting, like the workspaces: not what a plan does
        d.pop("outputs", None), d.pop("loop", None)  # the user's loop: memory accounting too
        d["meta"].pop(COSTS_META, None)
        d["meta"].pop(WORKSPACES_META, None)
        d["meta"].pop(BUILD_META, None)
        d["meta"].pop(TARGET_META, None)
        d["meta"].pop(SCALARS_META, None)
        d["meta"].pop(FROZEN_META, None)
        d["meta"].pop(LM_HEADS_META, None)
        d["meta"].pop(FUSED_HEADS_META, None)
        d["meta"].pop(CALL_RETURNS_META, None)
        for nd in d["nodes"]:
            del nd["fwd_flops"], nd["bwd_flops"], nd["fwd_cost"], nd["workspace_bytes"]
            del nd["dispatch"], nd["sac_op"]  # how a kept output is lowered, not what the plan does
            nd.pop("rows", None)  # how big each chunk of a chunked call is: memory accounting
        payload = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def content_hash(self) -> str:
        """A short hash of the whole graph, costs included (cache keys)."""
        return self.cached("_content_hash", self._content_hash)

    def _content_hash(self) -> str:
        payload = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    # -------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        d = {
            "format": FORMAT_VERSION,
            "name": self.name,
            "param_bytes": self.param_bytes,
            "input_bytes": self.input_bytes,
            "meta": dict(self.meta),
            "nodes": [n.to_dict() for n in self.nodes],
        }
        if self.rng_state_bytes:  # written only when set: files without it read as before
            d["rng_state_bytes"] = self.rng_state_bytes
        if self.frozen_param_bytes:
            d["frozen_param_bytes"] = self.frozen_param_bytes
        if self.spans:
            d["spans"] = [sp.to_list() for sp in self.spans]
        if self.outputs or self.loop != "held":  # written only when set: files without them read as before
            d["outputs"] = list(self.outputs)
            d["loop"] = self.loop
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Graph":
        """Build a graph from its JSON form (see :meth:`to_dict`).

        Only ``nodes`` is required. ``format`` defaults to the current version;
        ``param_bytes``, ``input_bytes`` default to 0, ``name`` to "" and
        ``meta`` to {}. Nodes may be listed in any topological-or-not order
        (sorted in linear time); NOTE [ Strict loading ] in ``graphs.schema``.

        Raises:
            GraphError: wrong format version, unknown key (naming the nearest
                known one), missing or malformed field, edge to an unknown
                node, cycle, a count that is no finite integer in ``[0, 2**62)``.
        """
        return graph_from_dict(cls, d)

    def with_nodes(self, nodes: Sequence[Node], **changes: Any) -> "Graph":
        """A copy with other nodes (and optionally other graph fields)."""
        return dataclasses.replace(self, nodes=tuple(nodes), **changes)


def _normalise_spans(spans: Iterable[Span | Sequence[Any]]) -> tuple[Span, ...]:
    out: dict[tuple[int, int], Span] = {}
    for sp in spans:
        if not isinstance(sp, Span):
            if len(sp) not in (3, 4):
                raise GraphError(f"a span is a (first, last, module[, extra_bytes]) tuple, got {sp!r}")
            sp = Span(*sp)
        if (isinstance(sp.first, bool) or isinstance(sp.last, bool) or not isinstance(sp.first, int)
                or not isinstance(sp.last, int) or not isinstance(sp.module, str)
                or isinstance(sp.extra_bytes, bool) or not isinstance(sp.extra_bytes, int) or sp.extra_bytes < 0):
            raise GraphError(f"span {sp!r}: first and last must be integers, module a string, extra_bytes >= 0")
        out.setdefault((sp.first, sp.last), sp)
    return tuple(sorted(out.values(), key=lambda sp: (sp.first, -sp.last)))


def graph_from_dict(cls: type[Graph], d: Any, *, owned: bool = False) -> Graph:
    """A :class:`~graphs.graph.Graph` from JSON (see ``Graph.from_dict``); ``owned``: ``d`` is the reader's own
    (``graphs.load``), and each node's JSON is let go of as its node is built (freeing a 20,000-node file's
    parsed JSON in one piece at the end took 0.2 s idle, 2 s at a load of 8, where no check could stop it)."""
    if not isinstance(d, Mapping):
        raise GraphError(f"a graph must be a JSON object with a 'nodes' list, got {type(d).__name__}")
    reject_unknown(d, GRAPH_KEYS, "graph")
    fmt = d.get("format", FORMAT_VERSION)
    if fmt != FORMAT_VERSION or isinstance(fmt, bool):
        raise GraphError(
            f"graph format version {short_repr(fmt)} is not supported (this version reads format {FORMAT_VERSION}); "
            "re-export the graph with this version of the tool"
        )
    if "nodes" not in d:
        raise GraphError("graph is missing the required top-level field 'nodes'")
    raw = d["nodes"]
    if not isinstance(raw, list):
        raise GraphError(f"graph field 'nodes' must be a list, got {type(raw).__name__}")
    every = poll_every()
    if every:  # NOTE [ Reading a graph under a deadline ] in graphs.reading
        nodes = []
        for i, x in enumerate(raw):
            if i % every == 0:
                poll(f"building the graph's nodes ({i:,} of {len(raw):,})")
            nodes.append(Node.from_dict(x, where=f"nodes[{i}]"))
            if owned:
                raw[i] = None
        poll("ordering the graph's nodes")
    elif owned:
        nodes = []
        for i, x in enumerate(raw):
            nodes.append(Node.from_dict(x, where=f"nodes[{i}]"))
            raw[i] = None
    else:
        nodes = [Node.from_dict(x, where=f"nodes[{i}]") for i, x in enumerate(raw)]
    ordered = toposort(nodes)
    poll("checking the graph")
    kw: dict[str, Any] = {}
    # rng_state_bytes, frozen_param_bytes: absent in older files (0)
    for key in ("param_bytes", "input_bytes", "rng_state_bytes", "frozen_param_bytes"):
        if key in d:
            kw[key] = count(d[key], key, "graph")
    if "name" in d:
        if not isinstance(d["name"], str):
            raise GraphError(f"graph field 'name' must be a string, got {short_repr(d['name'])}")
        kw["name"] = d["name"]
    if "meta" in d:
        if not isinstance(d["meta"], Mapping):
            raise GraphError("graph field 'meta' must be an object")
        kw["meta"] = dict(d["meta"])
    if "outputs" in d:  # absent in older files: no outputs recorded (NOTE [ The user's loop ])
        v = d["outputs"]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise GraphError(f"graph field 'outputs' must be a list of node names, got {short_repr(v)}")
        kw["outputs"] = tuple(v)
    if "loop" in d:
        if not isinstance(d["loop"], str):
            raise GraphError(f"graph field 'loop' must be a string ('held' or 'dropped'), got {short_repr(d['loop'])}")
        kw["loop"] = d["loop"]
    if "spans" in d:
        raw_spans = d["spans"]
        if not isinstance(raw_spans, list) or not all(
                isinstance(x, list) and len(x) in (3, 4) and isinstance(x[2], str)
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT for v in x[:2] + x[3:])
                for x in raw_spans):
            raise GraphError("graph field 'spans' must be a list of [first, last, module(, extra_bytes)] lists "
                             f"of integers in [0, 2**62)")
        if ordered is not nodes:
            raise GraphError("graph field 'spans' needs the nodes listed in topological order")
        kw["spans"] = tuple(Span(*x) for x in raw_spans)
    return cls(nodes=tuple(ordered), **kw)
