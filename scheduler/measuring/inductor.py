"""A bound on a compiled training step's peak, read from the graphs compile's partitioner makes, on fake tensors.

NOTE [ Compiled peak bound ]

``simulate`` predicts the eager step; under inductor the same plan saves
what AOTAutograd's partitioner chooses, fuses pointwise chains and, on
convolutional models, copies inputs and weights to channels-last. The eager
prediction is then no bound: ResNet-18's compiled step measures 1.20-1.28 of
it, a Llama plan 1.18 (``benchmarks/results/compile.md``). What inductor
saves can be read before anything runs:

1. A fake copy of the model (``FakeCopyMode``: no device, no memory; any
   size) gets the plan and is compiled by Dynamo with AOTAutograd, inductor's
   decompositions and inductor's own ``partition_fn`` (its joint-graph passes
   and ``min_cut_rematerialization_partition``), recording each forward and
   backward graph instead of generating kernels. A fake training step runs it.
2. Each pair of graphs is walked in order: every node's output storage
   (``meta["val"]``; views share their base's) is allocated when it runs and
   freed after its last use; the forward's outputs (the loss, the rest of the
   output, what the backward needs) live into the backward, which frees each
   saved tensor after its last use and keeps the gradients it returns.
   ``unfused`` counts every node's output: inductor materializes no more than
   that, so it bounds the graph's memory. ``fused`` leaves out pointwise
   outputs whose every user is pointwise or a reduction (what inductor fuses
   into one kernel): the estimate, closer, not a bound.
3. Around the graphs: the parameters, buffers and inputs (the base); the
   largest scratch a convolution allocates inside itself (``workspace_bytes``
   of the eager trace, where given: oneDNN's on CPU); and, in each graph
   where inductor's layout optimization is on (its own heuristic,
   ``GraphLowering.decide_layout_opt``, read on the recorded graph: on CPU
   any graph with a convolution forward), channels-last copies, all alive at
   once: of each 4-d input of the graph (in a forward the convolutions'
   weights and the batch; in a backward also the saved activations and
   incoming gradients) and, in a backward, of each 4-d gradient it returns
   (made channels-last, copied back to the parameter's layout). A backward
   gets convolution forwards where a region recomputes one: torchvision's
   MobileNetV3-small with one block as a region measured 24.64 MiB where
   the unplanned step measured 11.81, whatever the block, 1.47 of a bound
   that counted the forward's copies only. That pass rewrites layouts below
   the graphs, so there the bound is counted, not proven (``guaranteed``
   False; ``benchmarks/results/compile_thirdparty.md`` holds it against
   third-party models). With it off, or without convolutions, it is a
   bound.
4. Several graphs (a graph break): the largest graph's own peak plus what
   every other graph keeps (its outputs, saved tensors and gradients). A part
   Dynamo left eager (the body of a region that breaks its graph runs eagerly;
   a plan whose one region is the whole model runs all eager) shows as
   autograd nodes outside the compiled graphs (``eager_nodes``, read from the
   model's outputs' autograd graph before the loss): the eager prediction,
   ``simulate``, is added on top of the graphs' (loose, but a bound; with no
   graph at all, eager's prediction alone). Dynamo's recompile limits are
   raised for this compile: each call compiles a new copy, which must not
   fall back to eager for having compiled too many.
5. A ``loss=`` runs eagerly after the compiled model, as in the user's loop:
   it counts every storage its forward makes (under a dispatch mode that
   tallies them) and twice the model outputs it reads (its backward's
   gradients of them), all alive at once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..applying import apply
from .steps import LossFn
from .training import step_tensors, training_step

__all__ = ["CompiledBound", "compiled_bound"]


@dataclass(frozen=True)
class CompiledBound:
    """What :func:`compiled_bound` read (bytes). ``bound_bytes`` is the stated bound; ``fused_bytes`` the estimate;
    ``graphs`` the compiled graphs, ``eager_nodes`` the model's autograd nodes that computed outside them;
    ``loss_bytes`` what the user's ``loss=``, run eagerly after the model, was counted for; ``guaranteed``
    False where inductor's layout optimization rewrites convolutions (their copies then counted, not proven)."""

    bound_bytes: int
    fused_bytes: int
    base_bytes: int
    saved_bytes: int
    layout_bytes: int
    workspace_bytes: int
    graphs: int
    eager_nodes: int = 0
    loss_bytes: int = 0
    guaranteed: bool = True


@dataclass
class _Walk:
    """One pair of graphs walked: its peak above what was alive before it, and what it leaves alive."""

    peak: int = 0
    kept: int = 0
    saved: int = 0


def _key_bytes(value: Any) -> tuple[Any, int]:
    if not isinstance(value, torch.Tensor):
        return None, 0
    from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw
    from torch.multiprocessing.reductions import StorageWeakRef

    storage = value.untyped_storage()
    # a size Dynamo made dynamic (a frame compiled again at other sizes) is read at this step's own size, its hint
    return StorageWeakRef(storage), int(guarding_hint_or_throw(storage.nbytes()))


def _pointwise(node: torch.fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return node.op == "call_function" and torch.Tag.pointwise in tags


def _fuses(node: torch.fx.Node) -> bool:
    """A pointwise call or a reduction: what inductor fuses a pointwise producer into."""
    return _pointwise(node) or getattr(node.target, "__name__", "").split(".")[0] in _REDUCTIONS


_REDUCTIONS = frozenset({"sum", "amax", "amin", "mean", "var_mean", "prod", "max", "min", "argmax", "argmin"})


def _walk_graph(gm: torch.fx.GraphModule, live: dict[Any, int], fixed: set[Any], fused: bool) -> int:
    """Run ``gm``'s nodes over ``live`` (storage -> bytes); returns the largest total. Its outputs stay in
    ``live``; every other storage not in ``fixed`` leaves after its last use."""
    nodes = list(gm.graph.nodes)
    output = nodes[-1]
    outs = set(output.all_input_nodes)
    last: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            last[a] = n
    holders: dict[Any, set[torch.fx.Node]] = {}
    total = sum(live.values())  # kept as a running sum: a sum over ``live`` per node is quadratic in the graph
    top = total

    def drop(a: torch.fx.Node) -> None:
        nonlocal total
        k, _ = _key_bytes(a.meta.get("val"))
        if k is None or k in fixed or a in outs or k not in holders:
            return
        holders[k].discard(a)
        if not holders[k] and k in live:
            total -= live.pop(k)

    for n in nodes:
        if n.op == "output":
            break
        k, b = _key_bytes(n.meta.get("val"))
        virtual = (fused and _pointwise(n) and n not in outs and bool(n.users)
                   and all(_fuses(u) for u in n.users))
        if k is not None and not virtual:
            if k not in live:
                live[k] = b
                total += b
            holders.setdefault(k, set()).add(n)
        top = max(top, total)
        for a in n.all_input_nodes:
            if last.get(a) is n:
                drop(a)
        if not n.users:
            drop(n)
    return top


def _walk(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule | None, fused: bool) -> tuple[_Walk, int]:
    """A forward and its backward; also the bytes of the forward's inputs (its base)."""
    live: dict[Any, int] = {}
    for n in fw.graph.nodes:
        if n.op == "placeholder":
            k, b = _key_bytes(n.meta.get("val"))
            if k is not None:
                live[k] = b
    fixed = set(live)
    base = sum(live.values())
    top = _walk_graph(fw, live, fixed, fused)
    saved = sum(live.values()) - base
    if bw is not None:
        for n in bw.graph.nodes:  # the backward's inputs: saved tensors (alive already) and the incoming gradients
            if n.op == "placeholder":
                k, b = _key_bytes(n.meta.get("val"))
                if k is not None and k not in live:
                    live[k] = b
        top = max(top, _walk_graph(bw, live, fixed, fused))
    return _Walk(peak=top - base, kept=sum(live.values()) - base + saved, saved=saved), base


def _layout_bytes(gm: torch.fx.GraphModule | None, inference: bool) -> int:
    """Channels-last copies inductor's layout optimization makes in ``gm``, where inductor's own heuristic
    (``GraphLowering.decide_layout_opt``) turns it on for that graph: each input a convolution (forward or
    backward) reads from outside the graph (parameters, the batch, saved tensors, incoming gradients), once,
    and in a backward each 4-d gradient it returns (made channels-last, copied back to the parameter's
    layout)."""
    from torch._inductor.graph import GraphLowering

    if gm is None or not GraphLowering.decide_layout_opt(gm, is_inference=inference):
        return 0
    convs = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)
    copies: dict[Any, int] = {}
    backward = False
    for n in gm.graph.nodes:
        backward |= n.target is convs[1]
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() >= 4:
            k, b = _key_bytes(n.meta["val"])
            copies[k] = b
        elif n.op == "output" and backward:
            for a in n.all_input_nodes:
                v = a.meta.get("val")
                if isinstance(v, torch.Tensor) and v.dim() >= 4:
                    k, b = _key_bytes(v)
                    copies.setdefault(("out", k), b)
    return sum(copies.values())


#: Autograd nodes that are no eager computation: a compiled graph's backward, gradient accumulation, views.
_GLUE = ("CompiledFunctionBackward", "AccumulateGrad", "ViewBackward0", "AliasBackward0", "AsStridedBackward0",
         "UnsafeViewBackward0", "ExpandBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
         "SqueezeBackward0", "SqueezeBackward1", "UnsqueezeBackward0", "SelectBackward0", "SliceBackward0")


def _eager_nodes(outputs: Sequence[torch.Tensor]) -> int:
    """Autograd nodes behind ``outputs`` that compute outside the compiled graphs: code Dynamo left eager."""
    seen: set[Any] = set()
    todo = [t.grad_fn for t in outputs]
    eager = 0
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        eager += not any(fn.name().endswith(g) for g in _GLUE)
        todo.extend(f for f, _ in fn.next_functions)
    return eager


class _Made(torch.utils._python_dispatch.TorchDispatchMode):
    """The bytes of the new storages the ops under it make (the user's loss, run eagerly after the model)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info for r in func._schema.returns):
            self.bytes += sum(_key_bytes(t)[1] for t in torch.utils._pytree.tree_leaves(out)
                              if isinstance(t, torch.Tensor))
        return out


def _recorder(pairs: list[list[Any]]) -> Callable[..., Any]:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    def partition(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        from torch._guards import detect_fake_mode
        from torch._inductor.virtualized import V

        with V.set_fake_mode(detect_fake_mode(inputs)):  # as inductor's compile sets it (its random-op passes read it)
            fw, bw = partition_fn(gm, inputs, **kwargs)
        pairs.append([fw, bw])
        return fw, bw

    def inference(gm: Any, example_inputs: Any) -> Any:  # a graph with no backward (nothing requires grad)
        pairs.append([gm, None])
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                        bw_compiler=lambda gm, _: make_boxed_func(gm.forward), inference_compiler=inference,
                        partition_fn=partition, decompositions=select_decomp_table())


def compiled_bound(model: nn.Module, plan: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
                   loss: LossFn | None = None, *, loop: str = "held", graph: Any = None) -> CompiledBound:
    """A bound on the allocator's peak of ``model``'s training step with ``plan`` applied (None: unplanned) under
    ``torch.compile`` with inductor, read on fake tensors (NOTE [ Compiled peak bound ]): nothing runs on a
    device, any size of model.

    Args:
        model, args, kwargs, loss, loop: one training step, as ``scheduler.trace`` took it (``model`` is not
            changed: a fake copy is planned and compiled).
        plan: a ``solvers.Plan`` for ``model``'s graph, or None.
        graph: ``model``'s trace, for the largest scratch one op allocates (0 when None).
    """
    from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode

    base = sum(_key_bytes(t)[1] for t in {id(t): t for t in step_tensors(model, args, kwargs)}.values())
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with FakeCopyMode(fake):
        planned = copy.deepcopy(model)
    if plan is not None:
        apply(planned, plan)
    fargs, fkwargs = torch.utils._pytree.tree_map_only(torch.Tensor, fake.from_tensor, (tuple(args), dict(kwargs or {})))
    pairs: list[list[Any]] = []
    from .compiled import _own_backend

    fn = torch.compile(planned, backend=_own_backend(_recorder(pairs)))
    eager: list[int] = []

    def probe(out: Any) -> Any:  # the model's autograd graph read before the backward; the user's loss tallied
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        eager.append(_eager_nodes(leaves))
        if loss is None:
            return out
        with _Made() as made:
            value = loss(out)
        # the loss runs eagerly: what its forward makes, and its backward's gradients of what it read (two at once)
        eager.append(made.bytes + 2 * sum(_key_bytes(t)[1] for t in leaves if t.requires_grad))
        return value

    limits = torch._dynamo.config
    with fake, limits.patch(recompile_limit=max(limits.recompile_limit, 1024),  # this compile never runs eagerly
                            accumulated_recompile_limit=max(limits.accumulated_recompile_limit, 4096)):
        training_step(fn, fargs, fkwargs, probe, loop=loop)
    eager_nodes, loss_bytes = (eager + [0, 0])[:2]
    layout = sum(_layout_bytes(fw, bw is None) + _layout_bytes(bw, False) for fw, bw in pairs)
    scratch = 0 if graph is None else max(
        (n.workspace_bytes for n in graph.nodes if "aten.convolution.default" in n.dispatch), default=0)
    walks = {fused: [_walk(fw, bw, fused)[0] for fw, bw in pairs] for fused in (False, True)}

    def total(ws: list[_Walk]) -> int:  # above the base
        if not ws:
            return 0
        i = max(range(len(ws)), key=lambda j: ws[j].peak)
        return ws[i].peak + sum(w.kept for j, w in enumerate(ws) if j != i)

    extra = base + layout + scratch + loss_bytes
    if eager_nodes:  # a part ran eagerly (a region whose body breaks Dynamo's graph): eager's prediction on top
        if graph is None:
            raise ValueError(f"torch.compile left {eager_nodes} autograd nodes of this step eager (a region's body "
                             "breaking Dynamo's graph runs eagerly): pass graph= (the model's trace) to bound them "
                             "by the eager prediction")
        from solvers import simulate

        extra += simulate(graph, plan, record=False).peak_bytes - base
    return CompiledBound(bound_bytes=total(walks[False]) + extra, fused_bytes=total(walks[True]) + extra,
                         base_bytes=base, saved_bytes=sum(w.saved for w in walks[False]), layout_bytes=layout,
                         workspace_bytes=scratch, graphs=len(pairs), eager_nodes=eager_nodes, loss_bytes=loss_bytes,
                         guaranteed=not layout)
