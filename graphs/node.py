"""One node of the cost graph: an operation and what autograd keeps for it.

NOTE [ What a node saves ]
    Autograd does not keep "each node's output". For node ``i`` the saved set is

    * ``out(j)`` for every ``j`` in ``saves_inputs`` (a subset of ``inputs``:
      a linear layer saves its input, an ``add`` saves nothing);
    * ``out(i)`` itself when ``saves_output`` is true (ReLU, softmax, tanh,
      sigmoid keep what they produced);
    * ``saved_bytes`` of buffers the op allocates for its own backward and that
      are neither an input nor the output: dropout's mask, layer norm's mean and
      rstd, max-pool's indices, attention's logsumexp. Parameters and views of
      other tensors are *not* counted here: parameters are always live and a
      view shares its base's storage.

    A tensor therefore stays alive after the forward when its producer or any
    of its consumers saves it; a tensor saved by several nodes is one tensor
    (counted once). ``scheduler.trace`` measures these fields with
    ``torch.autograd.graph.saved_tensors_hooks`` and ``solvers.model.simulate``
    consumes them: the two agree on this definition and on nothing else.

Nodes whose output does not require grad (attention masks, position ids,
integer index arithmetic) have ``requires_grad=False``: autograd records no
backward for them and they save nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import GraphError
from .schema import MAX_COUNT, count, reject_unknown, short_repr

__all__ = ["Node", "toposort"]


@dataclass(frozen=True)
class Node:
    """One operation (or a group of fused operations) of the compute graph.

    Only ``name``, ``out_bytes``, ``fwd_flops`` and ``inputs`` are required in
    JSON; every other field has the default shown here.

    Attributes:
        name: unique name (the fx node name when traced).
        inputs: names of the nodes whose outputs this node consumes (the edges).
            Every name must belong to an earlier node.
        out_bytes: bytes of the output tensor(s).
        fwd_flops: forward FLOPs.
        fwd_cost: what recomputing the node costs, the solvers' objective
            (:meth:`Graph.recompute_costs`), in FLOP-equivalents: its
            estimated forward time times a FLOP rate (``meta["costs"]`` says
            which model and rate, NOTE [ Roofline costs ] in
            ``scheduler.tracing.roofline``), so totals stay comparable with
            FLOPs. ``None`` when building (and absent from JSON) means
            ``fwd_flops``; it is an int once built. ``dataclasses.replace``
            keeps it: pass ``fwd_cost=None`` with a new ``fwd_flops`` to
            make it follow.
        bwd_flops: backward FLOPs; default ``2 * fwd_flops`` (the usual
            matmul-dominated ratio) when absent from JSON.
        op: operator name (``aten.mm``, ``linear``, ``block``...), informative.
        saves_inputs: which of ``inputs`` autograd keeps for this node's
            backward; default (``None``) all of them. See NOTE [ What a node saves ].
        saves_output: whether autograd keeps this node's own output.
        saved_bytes: bytes of the node's own saved buffers (neither an input
            nor the output).
        workspace_bytes: transient bytes that exist only while the node's
            forward (or backward) runs.
        param_bytes: bytes of the parameters this node is the first to use;
            their gradients are created during its backward.
        module: dotted path in the module tree ("" when unknown).
        stochastic: draws random numbers (dropout); recompute must replay RNG.
        stateful: updates state in the forward (BatchNorm running stats).
        state_bytes: bytes of the buffers the node updates in its forward; a
            region holding it snapshots them while it recomputes (NOTE
            [ Stateful ops under recompute ] in ``scheduler.applying.modules``).
        recomputable: False forbids any plan from putting the node in a region.
        requires_grad: whether the output requires grad (has a backward).
        grad_views: the backward hands its inputs *views* of its output's
            gradient instead of new tensors (``cat``, ``stack``): that
            gradient's storage then lives until the last such input's
            backward is done. On a node of ``out_bytes == 0`` (a view such
            as ``transpose``) it passes a view it was handed on to its
            zero-byte inputs (NOTE [ View gradients through views ] in
            ``solvers.model.gradients``).
        members: names of the finer-grained nodes merged into this one (when a
            tracer coarsens the graph); empty means just ``name``.
        dispatch: the ATen overloads the node runs below autograd, in order
            (what a selective-checkpoint policy sees); empty when unknown.
        sac_op: position in ``dispatch`` of the one op that creates every
            storage the node owns (its output and own saved buffers), so a
            selective-checkpoint policy can keep them (NOTE [ Selective
            recompute ] in ``solvers.model.simulate``); -1: the node cannot be kept so.
        rows: the token rows of the output: the product of its shape but the
            last dimension (1 for a scalar), what a chunked call splits
            (NOTE [ Chunk counts and rows ] in ``solvers.model.chunks``); 0 when
            unknown (graphs traced before it was recorded, hand-built ones).
    """

    name: str
    inputs: tuple[str, ...] = ()
    out_bytes: int = 0
    fwd_flops: int = 0
    bwd_flops: int = 0
    fwd_cost: int | None = None
    op: str = ""
    saves_inputs: tuple[str, ...] | None = None
    saves_output: bool = False
    saved_bytes: int = 0
    workspace_bytes: int = 0
    param_bytes: int = 0
    module: str = ""
    stochastic: bool = False
    stateful: bool = False
    state_bytes: int = 0
    recomputable: bool = True
    requires_grad: bool = True
    grad_views: bool = False
    members: tuple[str, ...] = ()
    dispatch: tuple[str, ...] = ()
    sac_op: int = -1
    rows: int = 0

    _INT_FIELDS = ("out_bytes", "fwd_flops", "bwd_flops", "fwd_cost", "saved_bytes", "workspace_bytes", "param_bytes",
                   "state_bytes", "rows")
    _BOOL_FIELDS = ("saves_output", "stochastic", "stateful", "recomputable", "requires_grad", "grad_views")

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        saves = self.inputs if self.saves_inputs is None else tuple(self.saves_inputs)
        object.__setattr__(self, "saves_inputs", saves)
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "dispatch", tuple(self.dispatch))
        if self.fwd_cost is None:
            object.__setattr__(self, "fwd_cost", self.fwd_flops)

    def to_dict(self) -> dict[str, Any]:
        # Every field is a number, a string, a bool or a tuple of strings: a shallow copy is
        # ``dataclasses.asdict`` (which deep-copies each value: 38 us a node, 3.8 s for 100,000); the fields
        # are the instance's own dict, in their order (set so by the constructor and ``graphs.schema``).
        own = self.__dict__
        d = dict(own) if len(own) == len(_FIELDS) else {f.name: getattr(self, f.name) for f in _FIELDS}
        for key in ("inputs", "saves_inputs", "members", "dispatch"):
            d[key] = list(d[key])
        if not d["rows"]:  # written only when known: files without it read as before
            del d["rows"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "node") -> "Node":
        """Build a node from JSON, filling documented defaults (NOTE [ Strict loading ] in ``graphs.schema``).

        Raises:
            GraphError: a required field is missing, an unknown field (naming
                the nearest known one), a field of the wrong type, or a
                byte/FLOP count that is no finite integer in ``[0, 2**62)``.
        """
        return _node_from_dict(cls, d, where)


_FIELDS = dataclasses.fields(Node)


def _node_from_dict(cls: type[Node], d: Any, where: str) -> Node:
    """A :class:`~graphs.node.Node` from JSON, defaults filled (see ``Node.from_dict``)."""
    node = _plain_node(cls, d)
    if node is not None:
        return node
    if not isinstance(d, Mapping):
        raise GraphError(f"{where}: expected an object, got {type(d).__name__}")
    for key in ("name", "out_bytes", "fwd_flops", "inputs"):
        if key not in d:
            raise GraphError(f"{where}: missing required field {key!r}")
    name = d["name"]
    if not isinstance(name, str) or not name:
        raise GraphError(f"{where}: field 'name' must be a non-empty string, got {name!r}")
    where = f"node {name!r}"
    reject_unknown(d, cls.__dataclass_fields__, where)
    kw: dict[str, Any] = {"name": name}
    for key in cls._INT_FIELDS:
        if key in d:
            kw[key] = count(d[key], key, where)
    if "bwd_flops" not in d:
        kw["bwd_flops"] = 2 * kw["fwd_flops"]
    # "fwd_cost" absent (graphs written before it existed): Node makes it fwd_flops.
    for key in cls._BOOL_FIELDS:
        if key in d:
            if not isinstance(d[key], bool):
                raise GraphError(f"{where}: field {key!r} must be true or false, got {d[key]!r}")
            kw[key] = d[key]
    for key in ("op", "module"):
        if key in d:
            if not isinstance(d[key], str):
                raise GraphError(f"{where}: field {key!r} must be a string, got {d[key]!r}")
            kw[key] = d[key]
    if "dispatch" in d:
        v = d["dispatch"]
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise GraphError(f"{where}: field 'dispatch' must be a list of ATen op names, got {short_repr(v)}")
        kw["dispatch"] = tuple(v)
    if "sac_op" in d:
        v = d["sac_op"]
        n_ops = len(kw.get("dispatch", ()))
        if isinstance(v, bool) or not isinstance(v, int) or not (v == -1 or 0 <= v < n_ops):
            raise GraphError(f"{where}: field 'sac_op' must be -1 or a position in 'dispatch' (0..{n_ops - 1}), "
                             f"got {short_repr(v)}")
        kw["sac_op"] = v
    for key in ("inputs", "saves_inputs", "members"):
        if key in d:
            v = d[key]
            if key == "saves_inputs" and v is None:
                continue
            if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
                raise GraphError(f"{where}: field {key!r} must be a list of node names, got {short_repr(v)}")
            kw[key] = tuple(v)
    return cls(**kw)


_TYPES = {"int": (int,), "bool": (bool,), "str": (str,), "name": (str,), "names": (list,), "saves": (list, type(None)),
          "sac": (int,)}
#: (keys in order, their values' types) -> (getter of the counts, the list fields' keys), for the forms of node
#: seen to hold only fields of their exact JSON types; None: a form that does not.
_FORMS: dict[tuple, tuple | None] = {}
_DEFAULTS: dict[str, Any] = {}  # every field of a node with its default, in the dataclass's order
_STR = {str}


def _form(cls: type[Node], keys: tuple[str, ...], types: tuple[type, ...]) -> tuple | None:
    """How to check a node of this form quickly, or None (:func:`_plain_node`)."""
    if not _DEFAULTS:
        _DEFAULTS.update((f.name, None if f.default is dataclasses.MISSING else f.default)
                         for f in dataclasses.fields(cls))
    kinds = dict.fromkeys(cls._INT_FIELDS, "int") | dict.fromkeys(cls._BOOL_FIELDS, "bool") | {
        "name": "name", "op": "str", "module": "str", "inputs": "names", "members": "names", "dispatch": "names",
        "saves_inputs": "saves", "sac_op": "sac"}
    if not {"name", "out_bytes", "fwd_flops", "inputs"} <= set(keys) or not all(
            key in kinds and t in _TYPES[kinds[key]] for key, t in zip(keys, types)):
        return None
    counts = tuple(k for k in keys if kinds[k] == "int")
    lists = tuple(k for k, t in zip(keys, types) if t is list)
    return operator.itemgetter(*counts, *counts[:1]), lists  # at least two keys: the getter gives a tuple


def _plain_node(cls: type[Node], d: Any) -> Node | None:
    """The node of ``d`` when every field is of exactly its JSON type and in range (what ``save`` writes); None
    otherwise, and :func:`_node_from_dict` checks field by field and names what is wrong. The same node as
    ``cls(**fields)``, checked a form at a time and built without the frozen dataclass's ``__init__`` (reading
    a 20,000-node graph took 0.6 s here: NOTE [ Reading a graph under a deadline ] in ``graphs.reading``)."""
    if type(d) is not dict:
        return None
    keys, types = tuple(d), tuple(map(type, d.values()))
    form = _FORMS.get((keys, types), False)
    if form is False:
        form = _FORMS[(keys, types)] = _form(cls, keys, types)
    if form is None:
        return None
    counts, lists = form
    values = counts(d)
    if min(values) < 0 or max(values) >= MAX_COUNT or not d["name"]:
        return None
    for key in lists:
        if not _STR >= set(map(type, d[key])):
            return None
    fields = dict(_DEFAULTS)
    fields.update(d)
    sac = fields["sac_op"]
    if not (sac == -1 or 0 <= sac < len(fields["dispatch"])):
        return None
    if "bwd_flops" not in d:
        fields["bwd_flops"] = 2 * fields["fwd_flops"]
    node = cls.__new__(cls)
    node.__dict__.update(fields)
    node.__post_init__()  # lists to tuples, the saves_inputs and fwd_cost defaults: as the constructor
    return node


def toposort(nodes: list[Node]) -> list[Node]:
    """``nodes`` itself when its order is topological; otherwise a stable sort in linear time.

    Kahn's algorithm with in-degrees and a FIFO queue seeded in the given
    order: ``O(nodes + edges)`` (the previous rescan of the pending list was
    quadratic: 20,000 nodes listed in reverse took over 300 s). Nodes ready
    from the start keep their given order, and so do the users one node
    releases. Hand-written
    files may list nodes in any order; a cycle is an error that names a node
    on it.

    Raises:
        GraphError: a duplicate name, an input that is no node, or a cycle.
    """
    position: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.name in position:
            raise GraphError(f"node {n.name!r} appears twice")
        position[n.name] = i
    in_order = True
    for i, n in enumerate(nodes):
        for src in n.inputs:
            j = position.get(src)
            if j is None:
                raise GraphError(f"node {n.name!r}: input {src!r} is not a node of the graph")
            if j >= i:
                in_order = False
    if in_order:
        return nodes
    indegree = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for src in dict.fromkeys(n.inputs):
            indegree[i] += 1
            users[position[src]].append(i)
    ready = collections.deque(i for i, d in enumerate(indegree) if d == 0)
    order: list[Node] = []
    while ready:
        i = ready.popleft()
        order.append(nodes[i])
        for u in users[i]:  # ascending: a node's users become ready in the given order
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    if len(order) < len(nodes):
        stuck = next(n.name for i, n in enumerate(nodes) if indegree[i] > 0)
        raise GraphError(f"the graph has a cycle through node {stuck!r}; a compute graph must be acyclic")
    return order
