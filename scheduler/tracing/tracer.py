"""``scheduler.trace`` (this module's :func:`trace`): an ``nn.Module`` and example inputs -> a cost graph.

Example:
    >>> import scheduler
    >>> graph = scheduler.trace(model, (tokens,), {"targets": targets})
    >>> from scheduler.tracing.tracer import capture
    >>> traced = capture(model, (tokens,), {"targets": targets})   # the fx graph as well

The module is named ``tracer`` so that ``scheduler.trace`` stays the function whatever was imported before.

How: the model (with the loss, when ``loss=`` is given) is traced with
``torch.fx.symbolic_trace``, or with ``torch.export.export`` (training IR) when
fx fails (every HuggingFace model); the graph is checked against an eager run;
then every fx node is run on fake tensors and measured (``scheduler.tracing.costs``),
priced for the device it will run on (NOTE [ Roofline costs ] in
``scheduler.tracing.roofline``), and the nodes are grouped at the requested granularity
(NOTE [ Merging nodes ] in ``scheduler.tracing.build``).

Models on the ``meta`` device: build the model under ``torch.device("meta")``
(e.g. ``with torch.device("meta"): model = LlamaForCausalLM(config)``) and
pass example inputs on ``meta`` too. Nothing is allocated: the graph module is traced
symbolically and measured on fake tensors; the eager check compares shapes and dtypes only.

NOTE [ Traced contract ]
    :func:`capture` returns a :class:`Traced`; ``scheduler.apply`` builds on it.

    * ``gm`` is a ``torch.fx.GraphModule`` computing the model's forward (and
      the loss when ``loss=`` was given). Its parameters and buffers are the
      user's own tensor objects (rebinding is done when the tracer copied
      them), so an optimizer built on the model keeps working.
    * ``gm.graph`` is normalised: placeholders first (one per flattened input,
      in ``placeholders`` order), then the compute nodes, each ``get_attr``
      right before its first user, the output node last.
    * ``graph.nodes[k].members == members[k]``: the names of the ``gm.graph``
      nodes cost node ``k`` covers. Concatenated in order, ``members`` lists
      every node of ``gm.graph`` except placeholders and the output, each once,
      in ``gm.graph.nodes`` order; so a region ``[a, b]`` of the cost graph is
      the contiguous run of fx nodes ``members[a][0] .. members[b][-1]``.
    * ``flatten_inputs(*args, **kwargs)`` gives the values of the placeholders
      for the user's call; ``unflatten_outputs(value)`` turns the value of the
      output node's argument (what a graph with the default codegen returns,
      e.g. after ``split_module``) into the structure ``model(*args, **kwargs)``
      returns (with ``loss=``: the loss). ``traced(*args, **kwargs)`` runs
      ``gm`` with the user's calling convention.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn

from graphs import CALL_RETURNS_META, CkptError, COSTS_META, FROZEN_META, FUSED_HEADS_META, LM_HEADS_META, LOOPS, SCALARS_META, TARGET_META, WORKSPACES_META, Graph
from solvers.model.overheads import OVERHEADS_KEY

from .build import attribute_params, build_nodes, frozen_by_node, group_records, output_names
from .spans import MODULES_META, TREE_META, fused_heads, lm_heads, module_spans, module_tree, sequential_children
from ..distributed.tensor_parallel import TP_META, tp_sizes
from .held_arguments import add_held_arguments
from .forward_holds import add_forward_holds, eager_holds
from .loss_storage import split_loss_storage
from .capture import LossWrapper, TraceError, TraceMismatch, capture_graph_module, check_against_eager
from .costs import OpRecord, measure_ops
from .records import cuda_blocks
from .chunk_times import time_chunk_loops, times_chunk_loops, with_chunk_times
from .recompute_scale import recompute_scale
from .opclasses import timed_classes
from .outputs import capture_exposed, returned_nodes
from .overheads import target_overheads
from .roofline import model_dtype, roofline_records
from .target import (Target, TargetError, TargetKernels, check_target_for_costs, fake_device, meta_branch_message,
                     resolve_target, rng_state_bytes, target_peaks)
from .timing import COST_MODELS, measure_node_times, time_records

__all__ = ["Traced", "capture", "capture_for_plan", "trace", "TraceError", "TraceMismatch", "EvalModeWarning",
           "AUTO_MAX_NODES"]

log = logging.getLogger(__name__)

#: ``granularity="auto"``: the finest of op, fold, module depth 4, 3, 2, 1 with at most this many nodes.
AUTO_MAX_NODES = 400


class EvalModeWarning(UserWarning):
    """The model was traced in eval mode: the graph is of an evaluation step, not of the training step."""


@dataclass(frozen=True)
class Traced:
    """A traced model: the fx graph module, the cost graph, and how they correspond.

    See NOTE [ Traced contract ] in this module.

    Attributes:
        gm: the normalised graph module (parameters shared with the model).
        graph: the cost graph at the requested granularity.
        members: per cost node, the ``gm.graph`` node names it covers.
        placeholders: names of ``gm``'s placeholders, in order.
        method: ``"fx"`` or ``"export"``: the tracer that succeeded.
        module: what was traced (the model, or a :class:`LossWrapper` around it).
        records: the op-level measurements (one per compute fx node), to regroup
            without measuring again (:meth:`regroup`).
        granularity: the granularity ``graph`` was built at.
        sequentials: ``{path: children}`` of the model's plain ``nn.Sequential`` s
            (their runs of children are spans too, ``scheduler.tracing.spans``).
        extras: ``{span module: extra bytes}`` (NOTE [ Eager lifetimes in a recompute ]).
    """

    gm: torch.fx.GraphModule
    graph: Graph
    members: tuple[tuple[str, ...], ...]
    placeholders: tuple[str, ...]
    method: str
    module: nn.Module
    records: tuple[OpRecord, ...]
    granularity: str | int
    sequentials: Mapping[str, int] = dataclasses.field(default_factory=dict)
    extras: Mapping[str, int] = dataclasses.field(default_factory=dict)
    _bytes: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    # ----------------------------------------------------------- calling
    def flatten_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Values of ``gm``'s placeholders for the call ``model(*args, **kwargs)``."""
        return _flatten(self.gm, self.method, self.module, args, kwargs)

    def unflatten_outputs(self, value: Any) -> Any:
        """The output node's value -> what ``model(*args, **kwargs)`` (or the loss) returns."""
        if self.method == "export":
            info = self.gm.graph._codegen.pytree_info  # type: ignore[attr-defined]
            return pytree.tree_unflatten(list(value), info.out_spec)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.gm(*args, **kwargs)

    # --------------------------------------------------------- regrouping
    def regroup(self, granularity: str | int) -> "Traced":
        """The same trace at another granularity (no re-measuring)."""
        graph, members, gran = _assemble(list(self.records), granularity, self._bytes, self.graph.name,
                                         dict(self.graph.meta), self.sequentials, self.extras, self.graph.loop)
        return dataclasses.replace(self, graph=graph, members=members, granularity=gran)


def capture(model: nn.Module, args: Sequence[Any] | Any = (), kwargs: Mapping[str, Any] | None = None, *,
            loss: Callable[[Any], torch.Tensor] | None = None, granularity: str | int = "auto",
            method: str = "auto", check: bool = True, name: str | None = None, costs: str = "roofline",
            target: str | None = None, time_repeats: int = 5, workspaces: str = "auto", mode: str = "train",
            cost_device: str | None = None, loop: str = "held") -> Traced:
    """Trace ``model`` on example inputs and measure its cost graph.

    Args:
        model: the module, in the mode it will train in.
        args: positional example inputs (a single tensor is accepted).
        kwargs: keyword example inputs (e.g. ``{"targets": y}``).
        loss: ``loss(model_output) -> scalar``; included in the graph so the
            graph covers the whole training step (e.g. ``lambda out: out.loss``).
        granularity: ``"op"`` (one node per fx node), ``"fold"`` (views and
            other free ops folded into the node before them), an int module
            depth (fold, then merge consecutive nodes of one module at that
            depth), or ``"auto"``: the finest of those with at most
            :data:`AUTO_MAX_NODES` nodes.
        method: ``"auto"`` (fx, then export), ``"fx"`` or ``"export"``.
        check: compare the traced graph with an eager run before trusting it.
        name: the graph's name (default: the model's class name).
        costs: what recomputing a node costs (``Node.fwd_cost``, the
            solvers' objective): ``"roofline"`` (default; works on ``meta``),
            its forward time on the device by a roofline of FLOPs and bytes
            moved per kernel (NOTE [ Roofline costs ] in
            ``scheduler.tracing.roofline``); ``"time"``, its measured forward
            time on this machine (NOTE [ Time costs ] in
            ``scheduler.tracing.timing``: calibration); ``"flops"``, its
            counted FLOPs (the objective before roofline costs). Times are
            in FLOP-equivalents; ``meta["costs"]`` has the rate.
        target: the device the plan is for, whose kernels decide what
            autograd saves and whose roofline prices the recompute (NOTE [
            Trace targets ] in ``scheduler.tracing.target``): ``"cpu"``,
            ``"cuda"`` (an H100) or a GPU of ``scheduler.tracing.roofline.DEVICES``
            (``"A100-80GB"``); default: where the model is, ``"cuda"`` for a
            ``meta`` model. ``graph.meta["target"]`` records it and the
            attention kernels it ran.
        time_repeats: forward runs measured with ``costs="time"`` (median).
        workspaces: ``"measure"``: run each distinct ATen call that may
            hold buffers inside the op (forward and backward: convolutions,
            attention, normalisations...) once on real tensors of the
            target's device (the CPU for a ``cpu`` target, the model's GPU for
            a CUDA target) and count what it allocates beyond the tensors the
            trace sees (NOTE [ Op workspaces ] in
            ``scheduler.tracing.workspaces``); ``"none"``: do not; ``"auto"``
            (default): measure where the target's kernels can run here (the
            allocator's peak is above what the tensors alone say, so plans
            would not fit without it).
        mode: ``"train"`` (default): the graph is of a training step; a model
            with any module in eval mode (what ``from_pretrained`` returns, and
            a peft model around such a base) is traced with every module in
            training mode, its modes and buffers put back after, with an
            :class:`EvalModeWarning`. ``"as-is"``: trace the
            modules in the modes they are in (a model in eval mode warns: its
            graph has no dropout masks and BatchNorm uses running statistics).
        loop: the training loop the graph is planned for (NOTE [ The
            user's loop ] in ``graphs.graph``): ``"held"`` (default), the
            model's output is referenced through ``backward()``, as in
            ``out = model(**batch); out.loss.backward()`` (a plan for it
            fits the other loop too); ``"dropped"``, it is dropped before,
            as ``Trainer`` and ``loss = model(**batch).loss`` do. The
            output is every tensor of the model's return value (with
            ``loss=``, of the model's, not the loss's).
        cost_device: the former name of ``target`` (kept working).

    Returns:
        A :class:`Traced` (NOTE [ Traced contract ]).

    Raises:
        TraceError: neither tracer handled the model (the message names the
            failing module/op and what to try).
        TraceMismatch: the traced graph computes something else than the model.
    """
    if not isinstance(args, (tuple, list)):
        args = (args,)
    if costs not in COST_MODELS:
        raise TraceError(f"costs={costs!r} is not one of {', '.join(COST_MODELS)}")
    if cost_device is not None:  # its former name
        if target is not None and str(target).lower() != str(cost_device).lower():
            raise TraceError(f"target={target!r} and cost_device={cost_device!r}: cost_device is the former name of "
                             "target; pass target only")
        target = cost_device
    if workspaces not in ("none", "measure", "auto"):
        raise TraceError(f"workspaces={workspaces!r} is not one of 'auto', 'none', 'measure'")
    if loop not in LOOPS:
        raise TraceError(f"loop={loop!r} is not one of {', '.join(map(repr, LOOPS))}: 'held' when the loop keeps the "
                         "model's output through backward() (out = model(...); out.loss.backward()), 'dropped' when "
                         "it drops it first (Trainer)")
    args = tuple(args)
    kwargs = dict(kwargs or {})
    if mode not in ("train", "as-is"):
        raise TraceError(f"mode={mode!r} is not one of 'train' (trace the training step), 'as-is' (the modules' modes)")
    resting = [path for path, m in model.named_modules() if not m.training] if mode == "train" else []
    if resting:
        what = "is in eval mode (from_pretrained returns it so)" if not model.training else (
            f"is in training mode but {len(resting)} of its modules are not ({', '.join(resting[:2])}"
            f"{', ...' if len(resting) > 2 else ''}: a from_pretrained model wrapped by get_peft_model is so, and "
            "model.train() in the training loop puts them in training mode)")
        warnings.warn(
            f"{type(model).__name__} {what}: it is traced as it trains, every module in training mode for the trace "
            "and put back after, since a plan is for a training step. Call model.train() before tracing to say so, "
            "or pass mode='as-is' to trace the modes as they are (modules kept in eval mode while training)",
            EvalModeWarning, stacklevel=2)
        with _as_training(model):
            return capture(model, args, kwargs, loss=loss, granularity=granularity, method=method, check=check,
                           name=name, costs=costs, target=target, time_repeats=time_repeats,
                           workspaces=workspaces, loop=loop)
    if not model.training:  # mode="as-is": NOTE [ RNG replay decided at run time ] in scheduler.applying.rng
        warnings.warn(
            f"{type(model).__name__} is traced in eval mode: the graph is of an evaluation step (dropout keeps no masks "
            "and draws nothing, BatchNorm uses its running statistics), so a plan solved on it is not costed for "
            "training. Trace with mode='train' (the default) or after model.train()", EvalModeWarning, stacklevel=2)
    module: nn.Module = LossWrapper(model, loss) if loss is not None else model
    strip = "model." if loss is not None else ""
    if loss is not None:  # NOTE [ Finding the model's outputs ]
        gm, used, outputs = capture_exposed(model, loss, args, kwargs, method=method, capture=capture_graph_module)
    else:
        gm, used = capture_graph_module(module, args, kwargs, method=method)
        outputs = returned_nodes(gm)
    if check:
        check_against_eager(module, gm, args, kwargs)
    flat = _flatten(gm, used, module, args, kwargs)
    located = list(model.parameters()) + [a for a in flat if isinstance(a, torch.Tensor)]
    device = next((t.device for t in located if t.device.type == "meta"), None) or \
        next((t.device for t in located), torch.device("cpu"))
    try:
        plan_for = resolve_target(target, device)
        check_target_for_costs(plan_for, device, costs)
    except TargetError as exc:
        raise TraceError(str(exc)) from None
    ws_device = _workspace_device(workspaces, plan_for, device)
    moved = fake_device(plan_for, device)
    kernels = TargetKernels(plan_for, moved, real_cuda=device.type == "cuda") \
        if moved is not None or plan_for.kind == "cuda" else None
    # NOTE [ Measured op classes ]: a CPU roofline times its mispriced classes where the probe runs
    timed = timed_classes() if costs == "roofline" and plan_for.kind == "cpu" and ws_device is not None \
        and ws_device.type in ("cpu", "meta") else ()
    try:
        with cuda_blocks(plan_for.kind == "cuda"):  # NOTE [ CUDA blocks ]
            records, totals = measure_ops(gm, flat, strip_module=strip, workspaces=ws_device, device=moved,
                                          kernels=kernels, outputs=outputs or (), time_classes=timed,
                                          target_kind=plan_for.kind)
    except (RuntimeError, NotImplementedError) as exc:
        if moved is None or isinstance(exc, CkptError):
            raise
        raise TraceError(meta_branch_message(model, plan_for, exc)) from exc
    totals["rng_state_bytes"] = rng_state_bytes(plan_for)  # type: ignore[assignment]
    if not records:
        raise TraceError(f"{type(model).__name__} traced to a graph without operations; nothing to plan")
    name = name or type(model).__name__
    meta = _describe(model, name, args, kwargs, used)
    meta[TARGET_META] = plan_for.to_meta()
    if kernels is not None and kernels.attention:
        meta[TARGET_META]["attention"] = dict(kernels.attention)
    records, meta[COSTS_META] = _price(records, costs, plan_for, model, gm, flat, time_repeats)
    if ws_device is not None:
        meta[WORKSPACES_META] = str(ws_device)
    sequentials = sequential_children(model)
    graph, members, gran = _assemble(records, granularity, totals, name, meta, sequentials, {}, loop)
    extras: dict[str, int] = {}
    if graph.spans:
        from .eager_lifetimes import measure_call_extras

        every = module_spans(records, [[i] for i in range(len(records))], sequentials)[0]  # all granularities' spans
        held: list[tuple[int, tuple[str, ...]]] = []  # NOTE [ A call's held arguments ]
        returns: dict[str, str] = {}  # calls returning more than one tensor: no chunks (NOTE [ Chunked head ])
        holds: list[tuple[str, str]] = []  # NOTE [ Forward holds ]

        def lifetimes(ops: Sequence[str], storages: Sequence[tuple[int, int | None]]) -> set[int]:
            found, placed = eager_holds(records, ops, storages)
            holds.extend(found)
            return placed

        with cuda_blocks(plan_for.kind == "cuda"):
            extras = measure_call_extras(model, args, kwargs, loss, [sp.module for sp in every], held, returns,
                                         lifetimes)
        if returns:
            meta[CALL_RETURNS_META] = dict(sorted(returns.items()))
        graph, members, gran = _assemble(records, granularity, totals, name, meta, sequentials, extras, loop, held,
                                         holds)
    if costs == "roofline" and plan_for.kind == "cpu" and device.type == "cpu":
        # NOTE [ Chunk loops timed at their shapes ]: the loop as a plan runs it, on the model's own modules
        loops = time_chunk_loops(model, graph, members, gm) if times_chunk_loops() else None
        graph = with_chunk_times(graph, loops) if loops else graph
        if times_chunk_loops(key="recompute_scale"):  # NOTE [ Recompute timed in the step ]
            graph = recompute_scale(model, graph, args, kwargs, loss)
    placeholders = tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")
    log.info("traced %s with %s for %s: %d fx nodes -> %d cost nodes (granularity %s)", name, used,
             plan_for.describe(), len(records), len(graph), gran)
    return Traced(gm=gm, graph=graph, members=members, placeholders=placeholders, method=used, module=module,
                  records=tuple(records), granularity=gran, sequentials=sequentials, extras=extras, _bytes=totals)


def trace(model: nn.Module, args: Sequence[Any] | Any = (), kwargs: Mapping[str, Any] | None = None, *,
          loss: Callable[[Any], torch.Tensor] | None = None, granularity: str | int = "auto", **options: Any) -> Graph:
    """The cost graph of ``model``: ``capture(...).graph``. Same arguments as :func:`capture`."""
    return capture(model, args, kwargs, loss=loss, granularity=granularity, **options).graph


def capture_for_plan(model: nn.Module, plan: Any, args: Any, kwargs: Mapping[str, Any] | None = None, *,
                     loss: Callable[[Any], torch.Tensor] | None = None, granularity: str | int | None = None,
                     name: str | None = None) -> Traced:
    """Trace ``model`` as ``plan``'s graph was traced (its granularity and loop), leaving no trace of the run.

    The eager check runs the model: BatchNorm statistics are restored after
    it and the RNG is forked, so a training run that traces first and then
    steps sees the same buffers and random numbers as one that does not.
    """
    if granularity is None:
        recorded = str(plan.graph_meta.get("granularity", "auto"))
        granularity = int(recorded) if recorded.isdigit() else recorded
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers]
    devices = sorted({b.device.index or 0 for b in buffers if b.device.type == "cuda"})
    loop = getattr(plan, "loop", "") or "held"
    try:
        with torch.random.fork_rng(devices=devices):
            return capture(model, args, kwargs, loss=loss, granularity=granularity, name=name, loop=loop)
    finally:
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)


# --------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _as_training(model: nn.Module) -> Iterator[None]:
    """Every module of ``model`` in training mode, and its buffers as they were, until the block ends
    (the trace's eager runs would otherwise update BatchNorm statistics of a model meant to stay as it is)."""
    modes = [(m, m.training) for m in model.modules()]
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers]
    model.train()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)


def _price(records: list[OpRecord], costs: str, plan_for: Target, model: nn.Module,
           gm: torch.fx.GraphModule, flat: list[Any], time_repeats: int) -> tuple[list[OpRecord], dict]:
    """``records`` with the chosen cost model's ``fwd_cost``, and ``meta["costs"]`` (with the plan overheads'
    figures of the target: NOTE [ Overhead calibration ] in ``scheduler.tracing.overheads``)."""
    out, meta = _priced(records, costs, plan_for, model, gm, flat, time_repeats)
    return out, {**meta, OVERHEADS_KEY: target_overheads(plan_for.kind).to_dict()}


def _priced(records: list[OpRecord], costs: str, plan_for: Target, model: nn.Module,
            gm: torch.fx.GraphModule, flat: list[Any], time_repeats: int) -> tuple[list[OpRecord], dict]:
    if costs == "time":
        try:
            times = measure_node_times(gm, flat, repeats=time_repeats)
        except ValueError as exc:
            raise TraceError(str(exc)) from None
        return time_records(records, times)
    tensors = list(model.parameters()) + [a for a in flat if isinstance(a, torch.Tensor)]
    peaks = target_peaks(plan_for)
    dtype = model_dtype(list(model.parameters()) or tensors)
    if costs == "roofline":  # a recomputed kernel's hooks and graph: the target's figure (NOTE [ Plan overheads ])
        return roofline_records(records, peaks, dtype, target_overheads(plan_for.kind).recompute_op_s)
    return list(records), {"model": "flops", "device": peaks.name, "dtype": dtype, "flops_per_s": peaks.peak(dtype)}


def _assemble(records: list[OpRecord], granularity: str | int, totals: Mapping[str, Any], name: str,
              meta: dict, sequentials: Mapping[str, int], extras: Mapping[str, int], loop: str,
              held: Sequence[tuple[int, tuple[str, ...]]] = (), holds: Sequence[tuple[str, str]] = ()
              ) -> tuple[Graph, tuple[tuple[str, ...], ...], str | int]:
    if granularity == "auto":
        chosen: str | int = "op"
        for g in ("op", "fold", 4, 3, 2, 1):
            chosen = g
            if len(group_records(records, g)) <= AUTO_MAX_NODES:
                break
    else:
        if not (granularity in ("op", "fold") or (isinstance(granularity, int) and granularity >= 0)):
            raise TraceError(f"granularity {granularity!r} is not one of 'op', 'fold', 'auto' or a module depth >= 0")
        chosen = granularity
    groups = group_records(records, chosen)
    nodes = build_nodes(records, groups, dict(totals.get("trainable", {})))
    nodes = attribute_params(nodes, records, groups, dict(totals.get("trainable", {})))
    frozen_nodes = frozen_by_node(nodes, records, groups, dict(totals.get("frozen", {})))
    at = dict(totals.get("scalar_at", {}))  # NOTE [ Saved Python scalars ]: each node's (before the loss's split)
    scalar_nodes = {nd.name: n for nd, g in zip(nodes, groups) if (n := sum(at.get(p, 0) for p in g))}
    spans, modules = module_spans(records, groups, sequentials)
    spans = [dataclasses.replace(sp, extra_bytes=int(extras.get(sp.module, 0))) for sp in spans]
    outputs = output_names(records, groups, nodes)
    loss_extra = sum(records[m].storage_extra_bytes for m in groups[-1] if records[m].returned)
    nodes, spans = split_loss_storage(nodes, spans, loss_extra)  # NOTE [ A loss's input-sized storage ]
    nodes, spans = add_held_arguments(nodes, spans, held)  # NOTE [ A call's held arguments ]
    loss_workspace = max((records[m].fwd_workspace_bytes for m in groups[-1]), default=0)
    nodes, spans = add_forward_holds(nodes, spans, holds, loss_workspace)  # NOTE [ Forward holds ]
    meta = dict(meta, granularity=str(chosen), estimated_flops=sum(r.estimated_flops for r in records))
    meta[MODULES_META] = modules
    scalars = int(totals.get("scalar_bytes", 0))  # NOTE [ Saved Python scalars ] in scheduler.tracing.costs
    if scalars:  # named only when present: graphs without them keep their fingerprint
        meta["saved_scalar_bytes"] = scalars
        meta[SCALARS_META] = scalar_nodes  # per node: a pipeline stage holds its own per micro-batch
    frozen = int(totals["param_bytes"]) - int(totals.get("trainable_param_bytes", totals["param_bytes"]))
    if frozen:  # named only when present: per node, so that a pipeline stage holds its own (NOTE [ A stage's graph ])
        meta[FROZEN_META] = frozen_nodes
    graph = Graph(nodes=tuple(nodes), param_bytes=int(totals["param_bytes"]), frozen_param_bytes=frozen,
                  input_bytes=int(totals["input_bytes"]) + int(totals["buffer_bytes"]) + scalars, name=name, meta=meta,
                  spans=tuple(spans), rng_state_bytes=int(totals.get("rng_state_bytes", 0)),
                  outputs=outputs, loop=loop)
    return graph, tuple(nd.members for nd in nodes), chosen


def _workspace_device(workspaces: str, plan_for: Target, device: torch.device) -> torch.device | None:
    """Where op workspaces are measured (NOTE [ Op workspaces ]): on real kernels of the target's kind
    (the CPU for a CPU target, the model's GPU for a CUDA one), or None."""
    here = torch.device("cpu") if plan_for.kind == "cpu" else (device if device.type == "cuda" else None)
    if workspaces == "none" or (workspaces == "auto" and here is None):
        return None
    if here is None:
        raise TraceError(f"workspaces='measure' runs the target's kernels, and {plan_for.describe()} has none on this "
                         f"{device.type} model: pass workspaces='none', or trace the model on that GPU")
    return here


def _flatten(gm: torch.fx.GraphModule, method: str, module: nn.Module, args: tuple, kwargs: Mapping[str, Any]
             ) -> list[Any]:
    if method == "export":
        info = gm.graph._codegen.pytree_info  # type: ignore[attr-defined]
        flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != info.in_spec:
            raise TraceError(f"the inputs do not have the structure the model was traced with: "
                             f"expected {info.in_spec}, got {spec}")
        return flat
    sig = inspect.signature(module.forward)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return [bound.arguments[p] for p in sig.parameters]


def _describe(model: nn.Module, name: str, args: tuple, kwargs: Mapping[str, Any], method: str) -> dict:
    inputs = []
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            inputs.append({"shape": list(leaf.shape), "dtype": str(leaf.dtype).replace("torch.", "")})
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
    return {"model": name, "inputs": inputs, "dtype": ",".join(dtypes), "tracer": method,
            "training": bool(model.training), "parameters": sum(p.numel() for p in model.parameters()),
            TREE_META: module_tree(model), TP_META: tp_sizes(model), LM_HEADS_META: lm_heads(model),
            FUSED_HEADS_META: fused_heads(model)}
