"""Reading a graph's JSON form strictly: every field checked, nothing ignored.

NOTE [ Strict loading ]
    A misspelt field that is silently dropped gives a silently wrong answer
    (``"param_byte"`` ignored: the predicted peak falls by the parameters'
    size), and a number no solver can add up (NaN, 1e30) gives a traceback in
    every solver. So an unknown key is an error that names the nearest known
    one, and every byte or FLOP count must be a finite integer in
    ``[0, 2**62)`` (:data:`MAX_COUNT`), and so must the graph's totals
    (``Graph.validate``), so that every sum the solvers form stays exact in
    int64 numpy arrays and CP-SAT's integer model. ``Plan.from_dict`` follows
    the same rules (``solvers.model.plan``).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import math
import operator
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .graph import MAX_COUNT, CkptError, GraphError
from .reading import poll, poll_every

if TYPE_CHECKING:
    from .graph import Graph
    from .node import Node

__all__ = ["MAX_COUNT", "count", "reject_unknown", "node_from_dict", "graph_from_dict", "toposort", "GRAPH_KEYS"]

#: Top-level keys of a graph's JSON form.
GRAPH_KEYS = ("format", "name", "param_bytes", "input_bytes", "rng_state_bytes", "frozen_param_bytes", "meta", "nodes",
              "spans", "outputs", "loop")


def count(value: Any, key: str, where: str, error: type[CkptError] = GraphError) -> int:
    """``value`` as a byte or FLOP count: a finite integer in ``[0, MAX_COUNT)``.

    Integral floats (``4096.0``) are accepted.

    Raises:
        error: naming ``where`` and ``key``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{where}: field {key!r} must be an integer, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise error(f"{where}: field {key!r} must be a finite integer, got {value!r}")
    if value < 0:
        raise error(f"{where}: field {key!r} is negative ({value}); sizes and FLOPs are >= 0")
    if value >= MAX_COUNT:
        raise error(f"{where}: field {key!r} is {value:.4g}, not below 2**62; no real step holds that many "
                    "bytes or FLOPs (a unit mix-up?)")
    return int(value)


def reject_unknown(data: Mapping[str, Any], known: Iterable[str], where: str,
                   error: type[CkptError] = GraphError) -> None:
    """Raise ``error`` for the first key of ``data`` not in ``known``, naming the nearest known key."""
    known = list(known)
    for key in data:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"known fields: {', '.join(known)}"
            raise error(f"{where}: unknown field {key!r}; {hint}")


def node_from_dict(cls: type["Node"], d: Any, where: str) -> "Node":
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
            raise GraphError(f"{where}: field 'dispatch' must be a list of ATen op names, got {_short(v)}")
        kw["dispatch"] = tuple(v)
    if "sac_op" in d:
        v = d["sac_op"]
        n_ops = len(kw.get("dispatch", ()))
        if isinstance(v, bool) or not isinstance(v, int) or not (v == -1 or 0 <= v < n_ops):
            raise GraphError(f"{where}: field 'sac_op' must be -1 or a position in 'dispatch' (0..{n_ops - 1}), "
                             f"got {_short(v)}")
        kw["sac_op"] = v
    for key in ("inputs", "saves_inputs", "members"):
        if key in d:
            v = d[key]
            if key == "saves_inputs" and v is None:
                continue
            if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
                raise GraphError(f"{where}: field {key!r} must be a list of node names, got {_short(v)}")
            kw[key] = tuple(v)
    return cls(**kw)


_TYPES = {"int": (int,), "bool": (bool,), "str": (str,), "name": (str,), "names": (list,), "saves": (list, type(None)),
          "sac": (int,)}
#: (keys in order, their values' types) -> (getter of the counts, the names' keys, the list fields' keys), for
#: the forms of node seen to hold only fields of their exact JSON types; None: a form that does not.
_FORMS: dict[tuple, tuple | None] = {}
_DEFAULTS: dict[str, Any] = {}  # every field of a node with its default, in the dataclass's order


def _form(cls: type["Node"], keys: tuple[str, ...], types: tuple[type, ...]) -> tuple | None:
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


def _plain_node(cls: type["Node"], d: Any) -> "Node | None":
    """The node of ``d`` when every field is of exactly its JSON type and in range (what ``save`` writes); None
    otherwise, and :func:`node_from_dict` checks field by field and names what is wrong. The same node as
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


_STR = {str}


def graph_from_dict(cls: type["Graph"], d: Any, *, owned: bool = False) -> "Graph":
    """A :class:`~graphs.graph.Graph` from JSON (see ``Graph.from_dict``); ``owned``: ``d`` is the reader's own
    (``graphs.load``), and each node's JSON is let go of as its node is built (freeing a 20,000-node file's
    parsed JSON in one piece at the end took 0.2 s idle, 2 s at a load of 8, where no check could stop it)."""
    from .graph import FORMAT_VERSION, Span
    from .node import Node

    if not isinstance(d, Mapping):
        raise GraphError(f"a graph must be a JSON object with a 'nodes' list, got {type(d).__name__}")
    reject_unknown(d, GRAPH_KEYS, "graph")
    fmt = d.get("format", FORMAT_VERSION)
    if fmt != FORMAT_VERSION or isinstance(fmt, bool):
        raise GraphError(
            f"graph format version {_short(fmt)} is not supported (this version reads format {FORMAT_VERSION}); "
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
            raise GraphError(f"graph field 'name' must be a string, got {_short(d['name'])}")
        kw["name"] = d["name"]
    if "meta" in d:
        if not isinstance(d["meta"], Mapping):
            raise GraphError("graph field 'meta' must be an object")
        kw["meta"] = dict(d["meta"])
    if "outputs" in d:  # absent in older files: no outputs recorded (NOTE [ The user's loop ])
        v = d["outputs"]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise GraphError(f"graph field 'outputs' must be a list of node names, got {_short(v)}")
        kw["outputs"] = tuple(v)
    if "loop" in d:
        if not isinstance(d["loop"], str):
            raise GraphError(f"graph field 'loop' must be a string ('held' or 'dropped'), got {_short(d['loop'])}")
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


def toposort(nodes: list["Node"]) -> list["Node"]:
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
    order: list["Node"] = []
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


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."

