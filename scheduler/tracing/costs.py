"""Measure every fx node: FLOPs, output bytes, what autograd saves, flags.

The graph module is run node by node (``torch.fx.Interpreter``) on *fake*
tensors (``FakeTensorMode``): shapes, dtypes, storages and the autograd graph
are real, the data is not, so a 7B-parameter model built on the ``meta``
device costs nothing to measure. Per node:

* forward FLOPs: ``FlopCounterMode`` around the node;
* backward FLOPs: the autograd nodes a node creates are claimed by it; one
  backward from the outputs runs under ``FlopCounterMode`` with hooks on those
  autograd nodes, so each fx node gets the FLOPs of its own backward;
* bytes: tensors are identified by *storage*. A node *owns* the storages it
  creates (its ``out_bytes`` is their size); an output sharing an existing
  storage (a view, an in-place op, ``getitem``) is an alias and owns nothing;
  parameters, buffers, constants and the model's inputs belong to nobody;
* saves: ``saved_tensors_hooks`` record what autograd packs while the node
  runs; each saved tensor is resolved to its storage's owner: an earlier node
  (``saves`` lists it), the node itself (its output), nobody (parameters and
  inputs: not activations), or a storage that is neither (a buffer of the op
  itself: dropout's mask, layer norm's mean/rstd: ``own_saved_bytes``);
* stochastic: an op tagged ``nondeterministic_seeded`` ran; stateful: an op
  wrote into a parameter or buffer.

NOTE [ Ops without a FLOP formula ]
    ``FlopCounterMode`` counts matmuls, convolutions and attention, and
    nothing for elementwise ops, reductions, normalisations, softmax or
    dropout. Costed at zero, their recompute would look free and a solver
    would recompute any number of them to save a byte. So a node whose
    forward counts zero FLOPs but creates new storage is charged one FLOP per
    element it creates, and an autograd node whose backward counts zero is
    charged one per element of the gradients it produces. These estimates are
    kept apart in ``OpRecord.estimated_fwd_flops`` / ``estimated_bwd_flops`` (and their total in the graph's
    ``meta["estimated_flops"]``), so the counted part can still be compared
    with ``FlopCounterMode``.

NOTE [ Shared parameter gradients ]
    A node's backward is measured from its autograd nodes' pre-hook to their
    post-hook. The engine adds what a node returns into the gradients pending
    for the next autograd nodes only *after* the post-hook. For a parameter
    used by several nodes (tied input and output embeddings, an embedding
    read by an encoder and a decoder) every contribution after the first is
    added there into the pending one, out of place when that one is a view
    (a linear's weight gradient is a transpose; on fake tensors always): the
    pending gradient, the contribution and their sum are alive at once. In a
    T5 that sum (the size of the vocabulary embedding) was missed at the
    backward of ``decoder.embed_tokens`` and a real step peaked above
    ``simulate``. So when a node hands a gradient to an ``AccumulateGrad``
    that already received one, its measuring window stays open until the
    next autograd node starts (or the backward ends): the sum lands in the
    node's ``bwd_peak_bytes``, hence its ``workspace_bytes``, while the
    pending gradient is the parameter gradient ``simulate`` already holds
    since the backward of the parameter's last user.

NOTE [ Gradients of model inputs ]
    A model input that requires grad (a leaf the caller made with
    ``requires_grad=True``) gets its ``.grad`` in the backward of the first of
    its users the backward reaches, and keeps it to the end of the step, as a
    parameter does. Counted only as that node's workspace (or, when the node
    passes its output gradient on unchanged, as a residual ``add`` does, as
    that gradient, freed once the view chain after it copied it), it was
    missing from the later steps: a block ``x + fc(norm(x))`` whose branch
    ends in a window-merge view chain measured its ``x.grad`` above
    ``simulate`` at the branch's backward. So such an input's storage is
    watched and attributed like a trainable parameter's: the node that last
    touches it in the forward gets its bytes as ``param_bytes`` (a gradient
    kept from its backward on), and they leave its ``workspace_bytes``.
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils import stateless
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from .workspaces import conv_signature

__all__ = ["OpRecord", "measure_ops", "storage_key", "storage_bytes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpRecord:
    """Costs of one compute fx node (plus the ``get_attr`` nodes folded before it).

    Attributes:
        name: the fx node's name.
        members: fx node names covered (``get_attr`` nodes first, then ``name``).
        op: the fx target, printable.
        module: dotted module path ("" at the top level).
        inputs: positions (in the record list) of the records this one reads:
            direct producers and the owners of storages it reads through views.
        owners: the subset of ``inputs`` that own storage this node reads.
        out_bytes: bytes of the storages this node creates and returns.
        saves: positions of records whose output this node saves (may include
            its own position).
        own_saved_bytes: bytes of saved tensors owned by nobody else.
        fwd_flops, bwd_flops: counted FLOPs (NOTE [ Ops without a FLOP formula ]).
        grad_views: the backward returned views of its output's gradient for
            its inputs (``cat``): measured in the backward hooks.
        estimated_fwd_flops, estimated_bwd_flops: the part of ``fwd_flops``
            and ``bwd_flops`` counted as one per element rather than by
            ``FlopCounterMode``.
        param_keys: storage keys of the parameters the node touched.
        requires_grad, stochastic, stateful: flags.
        state_bytes: bytes of the buffers a stateful node reads or writes (all
            of a BatchNorm's: ``native_batch_norm`` updates the running
            statistics without declaring the write; ``num_batches_tracked``
            is what marks it stateful).
        returned: the graph's output returns this node's value.
        bwd_peak_bytes: the most bytes the node's backward had allocated at
            once (gradients of its inputs and parameters, and temporaries),
            including the sum the engine makes when it adds the node's
            contribution into a parameter gradient that another node's
            backward already started (NOTE [ Shared parameter gradients ]).
    """

    name: str
    members: tuple[str, ...]
    op: str
    module: str
    inputs: tuple[int, ...]
    owners: tuple[int, ...]
    out_bytes: int
    saves: tuple[int, ...]
    own_saved_bytes: int
    fwd_flops: int
    bwd_flops: int
    param_keys: tuple[int, ...]
    requires_grad: bool
    stochastic: bool
    stateful: bool
    returned: bool
    bwd_peak_bytes: int = 0
    estimated_fwd_flops: int = 0
    estimated_bwd_flops: int = 0
    grad_views: bool = False
    state_bytes: int = 0
    convs: tuple = ()  # signatures of the convolutions the node ran (scheduler.tracing.workspaces)
    aliases: tuple[int, ...] = ()  # records owning the storages its outputs view (NOTE [ Views of written storages ])
    writes: tuple[int, ...] = ()  # records owning the storages its ops write in place
    direct: tuple[int, ...] = ()  # records whose values it takes as arguments (``inputs`` without the owners)
    calls: tuple[tuple[str, str], ...] = ()  # (call id, class) of the submodule calls it runs in (tracing.spans)

    @property
    def estimated_flops(self) -> int:
        return self.estimated_fwd_flops + self.estimated_bwd_flops


def storage_key(t: torch.Tensor) -> int | None:
    """An id of the storage behind ``t`` (views share it); None without storage."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


class _Watch(TorchDispatchMode):
    """Sees every aten op: random ops, parameters touched, state written."""

    def __init__(self, param_keys: set[int], state_keys: set[int]):
        super().__init__()
        self.param_keys = param_keys
        self.state_keys = state_keys
        self.reset()

        self.live = 0  # bytes of storages created under the mode and still alive
        self.peak = 0
        self.tracking: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.tracking.discard(key)

    def reset(self) -> None:
        self.stochastic = False
        self.stateful = False
        self.state_read: dict[int, int] = {}  # storage key -> bytes, buffers the node's ops read or wrote
        self.convs: list[tuple] = []
        self.touched: dict[int, None] = {}
        self.written: dict[int, None] = {}  # storage keys written in place (aten schema: Tensor(a!))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.stochastic = True
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                if k in self.param_keys:
                    self.touched[k] = None
                elif k in self.state_keys:
                    self.state_read[k] = storage_bytes(t)
        if func is torch.ops.aten.convolution.default:
            self.convs.append(conv_signature(args))
        if func is torch.ops.aten.native_batch_norm.default and len(args) > 5 and args[5]:
            # training mode updates running_mean/var in place without declaring the write
            for t in args[3:5]:
                if isinstance(t, torch.Tensor) and storage_key(t) in self.state_keys:
                    self.stateful = True
        schema = func._schema
        if schema.is_mutable:
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    v = args[i] if i < len(args) else kwargs.get(a.name)
                    for t in pytree.tree_leaves(v):
                        if isinstance(t, torch.Tensor):
                            if storage_key(t) in self.state_keys:
                                self.stateful = True
                            self.written[storage_key(t)] = None
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                if k is not None and k not in self.tracking and k not in self.param_keys:
                    st = t.untyped_storage()
                    nbytes = int(st.nbytes())
                    self.tracking.add(k)
                    self.live += nbytes
                    weakref.finalize(st, self._freed, k, nbytes)
        self.peak = max(self.peak, self.live)
        return out


def _printable(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    if isinstance(t, torch._ops.OpOverload):
        return f"aten.{t.__name__}" if t.namespace == "aten" else str(t)
    return getattr(t, "__name__", str(t))


def module_path(node: torch.fx.Node, strip: str = "") -> str:
    """The innermost module a node belongs to, as a dotted path."""
    path = ""
    if node.op == "call_module":
        path = str(node.target)
    else:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path = str(list(stack.values())[-1][0])
    if strip and (path == strip.rstrip(".") or path.startswith(strip)):
        path = path[len(strip):] if path.startswith(strip) else ""
    return path


def module_calls(node: torch.fx.Node, strip: str = "") -> tuple[tuple[str, str], ...]:
    """The submodule calls a node runs inside, outermost first: ``(call id, class name)``.

    A call id is the module's dotted path, with ``@k`` appended for its
    ``k``-th call after the first (the tracers' ``nn_module_stack`` keys say
    which call it is). The root module (and the loss wrapper's ``strip``
    prefix) is left out.
    """
    out = []
    for key, value in (node.meta.get("nn_module_stack") or {}).items():
        path, cls = value[0], value[1] if len(value) > 1 else ""
        path = str(path)
        if strip:
            if path == strip.rstrip(".") or not path:
                continue
            if not path.startswith(strip):
                continue
            path = path[len(strip):]
        if not path:
            continue
        k = str(key).rsplit("@", 1)[1] if "@" in str(key) else "0"
        cname = cls.__qualname__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1].strip("'>")
        out.append((path if k == "0" else f"{path}@{k}", cname))
    return tuple(out)


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, fake: FakeTensorMode, counter: FlopCounterMode, watch: _Watch,
                 free_keys: set[int], strip: str):
        super().__init__(gm, garbage_collect_values=False)
        self.fake = fake
        self.counter = counter
        self.watch = watch
        self.free_keys = free_keys  # params, buffers, inputs, constants
        self.strip = strip
        self.owner: dict[int, int] = {}  # storage key -> record position
        self.keep: list[torch.Tensor] = []  # keeps storages alive (keys stay unique)
        self.records: list[OpRecord] = []
        self.pending_attrs: list[str] = []
        self.record_of: dict[str, int] = {}  # fx node name -> record position
        self.grad_owner: dict[Any, int] = {}  # autograd node -> record position
        self.bwd_flops: dict[int, int] = {}
        self.bwd_estimated: dict[int, int] = {}
        self.grad_views: set[int] = set()  # record positions whose backward returned views of its gradient
        self._bw_start = 0
        self._bw_pos = -1
        self._bw_base = 0
        self._bw_out: list[tuple[int, Any]] = []  # (storage key, weakref) of the output gradient in backward
        self.bwd_peak: dict[int, int] = {}  # record position -> most bytes its backward had allocated at once
        self._fed: set[Any] = set()  # AccumulateGrad nodes that already received a gradient in this backward
        self._tail = -1  # record position whose window stays open until the next pre-hook (shared parameter)

    def fetch_attr(self, target: str) -> Any:
        value = super().fetch_attr(target)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
            value = self.fake.from_tensor(value)
            k = storage_key(value)
            if k is not None:
                self.free_keys.add(k)
                self.keep.append(value)
        return value

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op in ("placeholder", "output"):
            return super().run_node(n)
        if n.op == "get_attr":
            self.pending_attrs.append(n.name)
            return super().run_node(n)
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t)
            return t

        self.watch.reset()
        f0 = self.counter.get_total_flops()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            result = getattr(self, n.op)(n.target, args, kwargs)
        fwd = self.counter.get_total_flops() - f0
        estimated = 0
        pos = len(self.records)
        # Inputs: direct producers, and owners of storages read.
        direct: dict[int, None] = {}
        for a in n.all_input_nodes:
            if a.name in self.record_of:
                direct[self.record_of[a.name]] = None
        in_tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        owners: dict[int, None] = {}
        for t in in_tensors:
            o = self.owner.get(storage_key(t))
            if o is not None:
                owners[o] = None
        # Outputs: new storages are owned by this node.
        out_tensors = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        out_bytes = 0
        aliases: dict[int, None] = {}
        for t in out_tensors:
            k = storage_key(t)
            if k is not None and k in self.owner:
                aliases[self.owner[k]] = None  # a view of (or the very) storage an earlier node made
            if k is None or k in self.free_keys or k in self.owner:
                continue
            self.owner[k] = pos
            self.keep.append(t)
            out_bytes += storage_bytes(t)
            if fwd == 0:
                estimated += t.numel()  # NOTE [ Ops without a FLOP formula ]
        # Saved tensors, by storage.
        saves: dict[int, None] = {}
        own_keys: dict[int, int] = {}
        for t in saved:
            k = storage_key(t)
            if k is None or k in self.free_keys:
                continue
            o = self.owner.get(k)
            if o is None:
                own_keys[k] = storage_bytes(t)
            else:
                saves[o] = None
                if o != pos:
                    owners[o] = None
        inputs = dict(direct)
        inputs.update(owners)
        requires_grad = any(t.requires_grad for t in out_tensors)
        self._claim_grad_fns(pos, out_tensors)
        members = tuple(self.pending_attrs) + (n.name,)
        self.pending_attrs = []
        self.record_of[n.name] = pos
        self.records.append(OpRecord(
            name=n.name, members=members, op=_printable(n), module=module_path(n, self.strip),
            calls=module_calls(n, self.strip),
            inputs=tuple(sorted(i for i in inputs if i != pos)), owners=tuple(sorted(i for i in owners if i != pos)),
            out_bytes=out_bytes, saves=tuple(sorted(saves)), own_saved_bytes=sum(own_keys.values()),
            fwd_flops=int(fwd + estimated), bwd_flops=0, param_keys=tuple(self.watch.touched),
            requires_grad=requires_grad, stochastic=self.watch.stochastic, stateful=self.watch.stateful,
            returned=False, estimated_fwd_flops=estimated, convs=tuple(self.watch.convs),
            state_bytes=sum(self.watch.state_read.values()) if self.watch.stateful else 0,
            aliases=tuple(sorted(aliases)), direct=tuple(sorted(i for i in direct if i != pos)),
            writes=tuple(sorted({self.owner[k] for k in self.watch.written if k in self.owner})),
        ))
        return result

    def _claim_grad_fns(self, pos: int, outs: Sequence[torch.Tensor]) -> None:
        """Mark the autograd nodes this fx node created (reachable from its outputs, not yet claimed)."""
        stack = [t.grad_fn for t in outs if t.grad_fn is not None]
        while stack:
            fn = stack.pop()
            if fn is None or fn in self.grad_owner:
                continue
            self.grad_owner[fn] = pos
            fn.register_prehook(functools.partial(self._bw_pre, pos))
            fn.register_hook(functools.partial(self._bw_post, pos, fn))
            stack.extend(f for f, _ in fn.next_functions)

    def _bw_pre(self, pos: int, grad_outputs: Any) -> None:
        self._close_tail()
        self._bw_start = self.counter.get_total_flops()
        if pos != self._bw_pos:  # a new run of this node's backward: measure from here
            self._bw_pos = pos
            self._bw_base = self.watch.live
            self.watch.peak = self.watch.live
            # The first autograd function of the node receives its output's gradient.
            # Weak references: a key only means that storage while its tensor lives (addresses are reused).
            self._bw_out = [(storage_key(g), weakref.ref(g)) for g in grad_outputs
                            if isinstance(g, torch.Tensor) and storage_key(g) is not None]

    def _bw_post(self, pos: int, fn: Any, grad_inputs: Any, grad_outputs: Any) -> None:
        counted = self.counter.get_total_flops() - self._bw_start
        if counted == 0 and self.records[pos].out_bytes > 0:
            # NOTE [ Ops without a FLOP formula ]: one per element of the gradients produced (views stay free)
            counted = sum(g.numel() for g in grad_inputs if isinstance(g, torch.Tensor))
            self.bwd_estimated[pos] = self.bwd_estimated.get(pos, 0) + counted
        self.bwd_flops[pos] = self.bwd_flops.get(pos, 0) + counted
        self.bwd_peak[pos] = max(self.bwd_peak.get(pos, 0), self.watch.peak - self._bw_base)
        # grad_views: a gradient this node hands to another node's output is a view of the
        # node's own output gradient (cat). Views made inside the node (a linear's reshapes
        # around addmm) do not count: the gradient leaving it is a new tensor.
        nxt = fn.next_functions
        for i, g in enumerate(grad_inputs):
            if not isinstance(g, torch.Tensor) or i >= len(nxt) or nxt[i][0] is None:
                continue
            to = nxt[i][0]
            if type(to).__name__ == "AccumulateGrad":
                if to in self._fed:  # NOTE [ Shared parameter gradients ]
                    self._tail = pos
                self._fed.add(to)
                continue
            if self.grad_owner.get(to, -1) == pos:
                continue
            k = storage_key(g)
            if any(k == key and ref() is not None for key, ref in self._bw_out):
                self.grad_views.add(pos)

    def _close_tail(self) -> None:
        """End the window kept open past a post-hook: what the engine allocated meanwhile is that node's."""
        pos, self._tail = self._tail, -1
        if pos >= 0:
            self.bwd_peak[pos] = max(self.bwd_peak.get(pos, 0), self.watch.peak - self._bw_base)

    def run_backward(self, result: Any) -> None:
        """One backward from the graph's outputs, attributing FLOPs to the fx nodes."""
        outs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.requires_grad
                and (t.is_floating_point() or t.is_complex())]
        if not outs:
            return
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        self._close_tail()


def measure_ops(gm: torch.fx.GraphModule, flat_inputs: Sequence[Any], *, strip_module: str = ""
                ) -> tuple[list[OpRecord], dict[str, int]]:
    """Run ``gm`` on fake copies of its state and inputs and measure every node.

    Args:
        gm: a normalised graph module (see ``capture.capture_graph_module``).
        flat_inputs: one value per placeholder, real or meta tensors.
        strip_module: prefix removed from module paths (a wrapper's child name).

    Returns:
        ``(records, totals)``: one :class:`OpRecord` per compute node in graph
        order, and graph-level byte counts ``param_bytes`` (unique parameter
        storages), ``buffer_bytes``, ``input_bytes``, ``trainable_param_bytes``
        and ``trainable`` (fake storage key -> bytes of each trainable parameter).
    """
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    param_keys: set[int] = set()
    state_keys: set[int] = set()
    totals = {"param_bytes": 0, "trainable_param_bytes": 0, "buffer_bytes": 0, "input_bytes": 0}
    seen_real: set[int] = set()
    trainable: dict[int, int] = {}  # fake storage key -> bytes, trainable parameters
    with fake:
        for kind, items in (("param", gm.named_parameters(remove_duplicate=False)),
                            ("buffer", gm.named_buffers(remove_duplicate=False))):
            for name, t in items:
                if id(t) not in memo:
                    f = fake.from_tensor(t, static_shapes=True)
                    if kind == "param":
                        f.requires_grad_(t.requires_grad)
                        # The fake copy carries the real ``.grad`` when one is set (after a step):
                        # the measured backward would then accumulate into it and differ.
                        f.grad = None
                    memo[id(t)] = f
                f = memo[id(t)]
                state[name] = f
                k = storage_key(f)
                state_keys.add(k)
                rk = storage_key(t) if t.device.type != "meta" else id(t)
                if rk not in seen_real:
                    seen_real.add(rk)
                    nbytes = storage_bytes(t)
                    if kind == "param":
                        totals["param_bytes"] += nbytes
                        totals["trainable_param_bytes"] += nbytes if t.requires_grad else 0
                    else:
                        totals["buffer_bytes"] += nbytes
                if kind == "param":
                    param_keys.add(k)
                    if t.requires_grad:
                        trainable[k] = storage_bytes(t)
        fake_inputs = []
        input_keys: set[int] = set()
        for v in flat_inputs:
            if isinstance(v, torch.Tensor):
                f = fake.from_tensor(v, static_shapes=True)
                k = storage_key(f)
                if k not in input_keys:
                    input_keys.add(k)
                    totals["input_bytes"] += storage_bytes(v)
                    if v.requires_grad and k not in param_keys:  # NOTE [ Gradients of model inputs ]
                        trainable[k] = storage_bytes(v)
                fake_inputs.append(f)
            else:
                fake_inputs.append(v)
    counter = FlopCounterMode(display=False)
    watch = _Watch(param_keys | set(trainable), state_keys)
    rec = _Recorder(gm, fake, counter, watch, set(state_keys) | input_keys, strip_module)
    with stateless._reparametrize_module(gm, state, tie_weights=True), torch.enable_grad():
        with fake, counter, watch:
            result = rec.run(*fake_inputs)
            rec.run_backward(result)
    records = [_replace(r, bwd_flops=int(rec.bwd_flops.get(i, 0)), bwd_peak_bytes=int(rec.bwd_peak.get(i, 0)),
                        estimated_bwd_flops=int(rec.bwd_estimated.get(i, 0)),
                        grad_views=i in rec.grad_views and r.out_bytes > 0)
               for i, r in enumerate(rec.records)]
    # Mark what the graph returns; attach trailing get_attr nodes to the last record.
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    returned = {rec.record_of[a.name] for a in out_node.all_input_nodes if a.name in rec.record_of}
    tail = tuple(rec.pending_attrs)
    for i in returned:
        records[i] = _replace(records[i], returned=True)
    if tail and records:
        records[-1] = _replace(records[-1], members=records[-1].members + tail)
    totals["trainable"] = trainable  # type: ignore[assignment]
    return records, totals


def _replace(r: OpRecord, **kw: Any) -> OpRecord:
    import dataclasses

    return dataclasses.replace(r, **kw)
