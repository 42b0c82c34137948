"""Runs the graph module node by node on fake tensors and records each node (``measure_ops``'s engine).

NOTE [ Ops without a FLOP formula ], [ Shared parameter gradients ] and
[ Gradients of model inputs ] in ``scheduler.tracing.costs`` state what the
recorder attributes to whom.

NOTE [ Which op a policy keeps ]
    A plan that keeps a node's output inside a region is lowered to a
    selective-checkpoint policy (``scheduler.applying.selective``). The
    policy never sees graph nodes: it is called once per ATen call the
    region's eager forward runs below autograd, with the overload
    (``aten.mm.default``) and nothing that says which node the call belongs
    to. So the tracer records, per fx node, the overloads it runs in that
    same order (``OpRecord.dispatch``: the ``OpWatch`` dispatch mode sits
    where the checkpoint's caching mode will, and skips the ops that mode
    skips, ``detach``), and ``Plan.save_ops`` names a kept node as "the
    ``k``-th call of overload X counted from the region's first node".

    A node is keepable (``sac_op`` >= 0) only when saving one call saves
    exactly what the node owns, and nothing else changes:

    * one call returns exactly the storages the node owns (its new outputs
      and its own saved buffers: layer norm's mean and rstd), and every
      other call of the node is free (views, ``_unsafe_view``: no kernel,
      no write), so skipping that call skips the node's whole cost;
    * the node draws no random numbers: a cached dropout would not advance
      the generator in the recompute and every later mask would differ;
    * the node updates no state (BatchNorm: the call also writes the running
      statistics, and its three outputs are not all the node's);
    * no later node writes its storage in place (``build_nodes`` checks:
      the checkpoint refuses a cached tensor that was modified).
    * the call is no ``lift_fresh_copy`` / ``lift_fresh``: ``torch.export``
      lifts a tensor constant made in ``forward`` (``torch.tensor(...)``,
      transformers' GPT-2 attention) to such a call, which the eager forward
      never dispatches, so the policy would wait for a call that does not
      come (measured: ``SaveOpsMismatch`` on ``transformer.h.0``, before such
      calls were recomputed instead, NOTE [ Kept calls that do not come ]; keeping a
      constant saves nothing worth a byte anyway).
    * the call is no dtype conversion (``_to_copy``): how many of those a
      forward makes depends on the dtype it runs in (a model moved to bf16
      after an fp32 trace, or run under autocast, makes casts the trace did
      not have, and ``.to(float32)`` of an fp32 tensor makes none), so the
      ``k``-th one is not the same call from one setup to the next (NOTE [
      Kept calls that do not come ] in ``scheduler.applying.selective``);
      every other overload keeps its count under a cast.

    Everything else (several calls creating storage, merged nodes with more
    than one such member) is ``sac_op = -1``, and the solvers never keep it.
"""

from __future__ import annotations

import functools
import math
import re
import weakref
from typing import Any, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from .records import OpRecord, fake_copy, storage_bytes, storage_key
from .watch import OpWatch

__all__ = ["Recorder", "module_path", "module_calls"]


def _printable(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    if isinstance(t, torch._ops.OpOverload):
        return f"aten.{t.__name__}" if t.namespace == "aten" else str(t)
    return getattr(t, "__name__", str(t))


#: A slice of a ``ModuleList`` in an export path: ``layers.slice(None, 2, None).0``.
_SLICE = re.compile(r"\.slice\((None|\d+), (None|\d+), (None|\d+)\)((?:\.slice\((?:None|\d+), (?:None|\d+), "
                    r"(?:None|\d+)\))*)\.(\d+)(?=\.|$)")


def _unsliced(path: str) -> str:
    """``path`` with each ``ModuleList`` slice resolved to the index it names.

    ``torch.export`` names a module reached through a sliced container
    (transformers' ``for layer in self.layers[: n]``, in some call paths:
    a peft prefix-tuning wrapper) by the slice, ``layers.slice(None, 2,
    None).0``, a path the model does not have, so a plan naming it could
    not be applied. Slices with no negative bounds resolve without the
    container's length (``range`` does the arithmetic); others are left.
    """
    def resolve(m: re.Match) -> str:
        slices = [m.group(0)[1:].split(".")[0]] + re.findall(r"slice\([^)]*\)", m.group(4))
        r: range = range(1 << 62)
        for text in slices:
            start, stop, step = (None if v == "None" else int(v) for v in text[6:-1].split(", "))
            r = r[slice(start, stop, step)]
        index = int(m.group(5))
        return f".{r[index]}" if index < len(r) else m.group(0)
    return _SLICE.sub(resolve, path) if "slice(" in path else path


def module_path(node: torch.fx.Node, strip: str = "") -> str:
    """The innermost module a node belongs to, as a dotted path."""
    path = ""
    if node.op == "call_module":
        path = str(node.target)
    else:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path = _unsliced(str(list(stack.values())[-1][0]))
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
        path = _unsliced(str(path))
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


#: Overloads a policy never keeps (NOTE [ Which op a policy keeps ]): an export graph runs them where the eager
#: forward runs none, or their count depends on the dtype the forward runs in.
_NOT_KEPT = ("aten.lift_fresh_copy.", "aten.lift_fresh.", "aten._to_copy.")


def _policy_calls(watch: OpWatch, owned: set[int]) -> tuple[tuple[str, ...], int]:
    """``(dispatch, sac_op)`` of the node the watch just saw (NOTE [ Which op a policy keeps ])."""
    calls = watch.policy_calls
    dispatch = tuple(name for name, _, _ in calls)
    if not owned:
        return dispatch, -1
    hits = [i for i, (_, keys, free) in enumerate(calls) if not free and set(keys) == owned]
    if len(hits) != 1 or any(not free for j, (_, _, free) in enumerate(calls) if j != hits[0]):
        return dispatch, -1
    if calls[hits[0]][0].startswith(_NOT_KEPT):
        return dispatch, -1
    return dispatch, hits[0]


class Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, fake: FakeTensorMode, counter: FlopCounterMode, watch: OpWatch,
                 free_keys: set[int], strip: str, device: torch.device | None = None):
        super().__init__(gm, garbage_collect_values=False)
        self.fake = fake
        self.device = device  # where fake copies of meta constants go (NOTE [ Trace targets ])
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
        self.fwd_end: dict[int, int] = {}  # record position -> watched bytes live when its forward ended
        # AccumulateGrad nodes that already received a gradient in this backward -> whether the gradient
        # pending there is a view (NOTE [ Shared parameter gradients ])
        self._fed: dict[Any, bool] = {}
        self._tail = -1  # record position whose window stays open until the next pre-hook (shared parameter)
        self.scalar_bytes = 0  # NOTE [ Saved Python scalars ] in scheduler.tracing.costs
        self._scalar_keys: set[int] = set()
        self.scalar_at: dict[int, int] = {}  # record position -> its share of scalar_bytes

    def fetch_attr(self, target: str) -> Any:
        value = super().fetch_attr(target)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
            value = fake_copy(self.fake, value, self.device)
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
        pos = len(self.records)
        self.watch.context = ("f", pos, self.watch.live)  # NOTE [ Op workspaces ]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            result = getattr(self, n.op)(n.target, args, kwargs)
        self.watch.context = None
        fwd = self.counter.get_total_flops() - f0
        estimated = 0
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
        created: set[int] = set()
        for t in out_tensors:
            k = storage_key(t)
            if k is not None and k in self.owner:
                aliases[self.owner[k]] = None  # a view of (or the very) storage an earlier node made
            if k is None or k in self.free_keys or k in self.owner:
                continue
            self.owner[k] = pos
            created.add(k)
            self.keep.append(t)
            out_bytes += storage_bytes(t) + self.watch.extra_storage.get(k, 0)
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
        claimed = self._claim_grad_fns(pos, out_tensors)
        # NOTE [ Identity nodes ]: an op that returns its very input and records no autograd node
        # (dropout with p=0, contiguous() of a contiguous tensor) has no backward: the gradient of its
        # output *is* its input's, made by its consumers' backward (they read the input's storage).
        identity = bool(out_tensors) and not claimed and all(any(o is t for t in in_tensors) for o in out_tensors)
        requires_grad = any(t.requires_grad for t in out_tensors) and not identity
        members = tuple(self.pending_attrs) + (n.name,)
        self.pending_attrs = []
        self.record_of[n.name] = pos
        self.fwd_end[pos] = self.watch.live
        dispatch, sac_op = _policy_calls(self.watch, created | set(own_keys))
        self.records.append(OpRecord(
            name=n.name, members=members, op=_printable(n), module=module_path(n, self.strip),
            calls=module_calls(n, self.strip),
            inputs=tuple(sorted(i for i in inputs if i != pos)), owners=tuple(sorted(i for i in owners if i != pos)),
            out_bytes=out_bytes, saves=tuple(sorted(saves)), own_saved_bytes=sum(own_keys.values()),
            fwd_flops=int(fwd + estimated), bwd_flops=0, param_keys=tuple(self.watch.touched),
            requires_grad=requires_grad, stochastic=self.watch.stochastic, stateful=self.watch.stateful,
            returned=False, estimated_fwd_flops=estimated, kernels=tuple(self.watch.kernels),
            kernel_ops=tuple(self.watch.kernel_ops),
            state_bytes=sum(self.watch.state_read.values()) if self.watch.stateful else 0,
            aliases=tuple(sorted(aliases)), direct=tuple(sorted(i for i in direct if i != pos)),
            writes=tuple(sorted({self.owner[k] for k in self.watch.written if k in self.owner})),
            dispatch=dispatch, sac_op=-1 if self.watch.stochastic or self.watch.stateful else sac_op,
            free_calls=all(free for _, _, free in self.watch.policy_calls),
            storage_extra_bytes=sum(self.watch.extra_storage.get(k, 0) for k in created),
            rows=int(math.prod(out_tensors[0].shape[:-1])) if out_tensors else 0,
        ))
        return result

    def owners_of(self, names: Sequence[str]) -> set[int]:
        """Record positions owning a storage of the values of the fx nodes ``names`` (after :meth:`run`;
        parameters, buffers and inputs belong to nobody)."""
        wanted = set(names)
        found: set[int] = set()
        for node, value in self.env.items():
            if node.name in wanted:
                for t in pytree.tree_leaves(value):
                    if isinstance(t, torch.Tensor) and (o := self.owner.get(storage_key(t))) is not None:
                        found.add(o)
        return found

    def _claim_grad_fns(self, pos: int, outs: Sequence[torch.Tensor]) -> int:
        """Mark the autograd nodes this fx node created (reachable from its outputs, not yet claimed); how many."""
        stack = [t.grad_fn for t in outs if t.grad_fn is not None]
        claimed = 0
        while stack:
            fn = stack.pop()
            if fn is None or fn in self.grad_owner:
                continue
            claimed += 1
            self.grad_owner[fn] = pos
            self._note_scalars(pos, fn)
            fn.register_prehook(functools.partial(self._bw_pre, pos))
            fn.register_hook(functools.partial(self._bw_post, pos, fn))
            stack.extend(f for f, _ in fn.next_functions)
        return claimed

    def _note_scalars(self, pos: int, fn: Any) -> None:
        """Count what ``fn`` (claimed by record ``pos``) saved without the pack hook: real 0-dim tensors
        among fake ones (wrapped Python numbers, NOTE [ Saved Python scalars ] in ``scheduler.tracing.costs``)."""
        for attr in dir(fn):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(fn, attr)
            except RuntimeError:  # released or not unpackable: nothing held
                continue
            for t in pytree.tree_leaves(value):
                if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor) or t.dim() != 0:
                    continue
                k = storage_key(t)
                if k is None or k in self._scalar_keys:
                    continue
                self._scalar_keys.add(k)
                self.keep.append(t)  # keys stay unique
                self.scalar_bytes += storage_bytes(t)
                self.scalar_at[pos] = self.scalar_at.get(pos, 0) + storage_bytes(t)

    def _bw_pre(self, pos: int, grad_outputs: Any) -> None:
        self._close_tail()
        self._bw_start = self.counter.get_total_flops()
        # Each autograd function's window starts at its own pre-hook: what the engine allocates between two
        # functions of a node (a sum the fake engine makes out of place) is no part of it
        # (NOTE [ Shared parameter gradients ] in scheduler.tracing.costs).
        self.watch.peak = self.watch.live
        if pos != self._bw_pos:  # a new run of this node's backward: measure from here
            self._bw_pos = pos
            self._bw_base = self.watch.live
            # The first autograd function of the node receives its output's gradient.
            # Weak references: a key only means that storage while its tensor lives (addresses are reused).
            self._bw_out = [(storage_key(g), weakref.ref(g)) for g in grad_outputs
                            if isinstance(g, torch.Tensor) and storage_key(g) is not None]
            self.watch.context = ("b", pos, self._bw_base)  # NOTE [ Op workspaces ]

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
                if self._fed.get(to):  # NOTE [ Shared parameter gradients ]: added out of place, once
                    self._tail = pos
                self._fed[to] = to not in self._fed and g._is_view()
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
        self.watch.context = None

