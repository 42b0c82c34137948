"""Apply a plan onto the user's own module: each region is one submodule call, checkpointed in place.

``apply(model, plan)`` looks up the submodule each region names
(``Plan.modules``: ``transformer.h.3``, ``layers.0.attn``, or ``layer1[0:2]``
for a run of an ``nn.Sequential``'s children) and replaces that submodule's
``forward`` *on the instance* by a :class:`RegionForward` that runs the
original forward under ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``. Nothing is re-traced; the user's own forward runs
as written, so other batch sizes and sequence lengths, ``eval``/``no_grad``,
``generate``, hooks, adapters, dtype changes, ``state_dict``,
``save_pretrained``, ``pickle``/``deepcopy``, DDP, FSDP2 and
``torch.compile`` keep working. ``remove(model)`` puts the original
``forward`` s back.

NOTE [ Checkpointing forward, not __call__ ]
    Like transformers' ``GradientCheckpointingLayer``, we checkpoint the
    module's ``forward`` and leave ``__call__`` alone: the module's hooks
    (the user's, FSDP2's unshard/reshard) run once, outside the region,
    and are not replayed by the recompute. An instance attribute
    ``forward`` shadows the class's method; module names, structure and
    ``state_dict`` keys do not change, and a module deep-copied or pickled
    with its wrapper keeps it (the wrapper holds the module, not a bound
    method, and looks the class's forward up at each call).

NOTE [ Recompute at the region's end ] (the rule ``solvers.model.simulate`` costs)
    Non-reentrant checkpoint recomputes a region when the backward first
    unpacks a tensor the region saved. Ops at the end of a region that save
    nothing (views, a residual read) run their backward *before* that, with
    a gradient alive that ``simulate`` does not count during the recompute
    (Swin's window merge: a plan solved to its budget measured 22 KiB over).
    Each region therefore saves an empty probe first (0 bytes, the first
    tensor it packs, so early stop still ends the recompute at the last
    tensor really needed), and a gradient hook on the region's outputs
    (``mode="any"``) unpacks it, which runs the recompute there. The probe is
    held by the hook only, never by the function the checkpoint keeps (a
    cycle through the checkpoint's frame would keep the region's inputs alive
    until the garbage collector runs). Under FSDP2 the probe is left out: the
    recompute must wait for FSDP's pre-backward unshard, which the backward
    of the region's own ops follows.

NOTE [ Stateful ops under recompute ]
    A region runs twice: in the forward and when the backward reaches it.
    BatchNorm updates its running statistics in the forward and would update
    them twice. When a region's recompute starts, the running statistics of
    the BatchNorm-style modules inside it are cloned; when it ends they are
    copied back, in a ``finally`` (non-reentrant checkpoint stops a recompute
    early by raising inside it). In train mode BatchNorm normalises with batch
    statistics, so the recompute's output does not depend on them, and the
    statistics after a step equal those without checkpointing. The copies
    are the node's ``state_bytes`` in ``simulate``.

NOTE [ RNG state per region (applying) ]
    ``preserve_rng_state=True`` stores the CPU generator's state (5,056 bytes
    on this CPU build: ``torch.get_rng_state().numel()``) with each region
    until its backward, so that dropout draws the same mask twice. Regions
    whose traced nodes drew no random numbers (``Plan.stochastic`` says which)
    skip it when they still draw none as they run: that is decided at each
    call, never taken from the trace alone (NOTE [ RNG replay decided at run
    time ] in ``scheduler.applying.rng``). What a stored state costs is
    ``Graph.rng_state_bytes``, counted by ``simulate`` and the exact solvers
    (NOTE [ RNG state per region ] in ``solvers.model.terms``).

NOTE [ What a region holds ]
    A plan's memory and its RNG flags are those of the modules the trace saw
    inside each region. ``apply`` compares, for each region, every submodule
    under it with the trace's module tree (``Graph.meta["module_tree"]``:
    path -> class, a class matching when it is the traced one or a subclass of
    it, so FSDP2's wrapped classes pass): a module missing, added or of
    another class is refused, naming it (a timm ResNet traced with
    ``drop_path_rate=0`` holds ``Identity`` where the same model built with
    stochastic depth holds ``DropPath``). ``check=False`` skips it.

NOTE [ Caches under recompute ]
    A key/value cache passed into a checkpointed call would be written twice
    (once more by the recompute), and the recompute would then see longer keys
    than the forward did. As transformers does under gradient checkpointing,
    a call that trains (grad enabled) gets ``use_cache=False`` and no cache
    argument, and a ``CacheDropped`` warning says so (a ``warnings`` warning,
    shown once per region by Python's default filter, where transformers
    logs its own once); without grad (evaluation,
    ``generate``) nothing is checkpointed and the call runs as written. A
    cache the model returns then holds only the calls outside regions. A
    cache that already holds the call's keys (peft's prefix tuning) is kept,
    and the recompute sees it as the forward did (NOTE [ Filled caches
    replayed ] in ``scheduler.applying.caches``).
    ``apply`` also marks the region modules so that libraries that check
    for checkpointing see it (NOTE [ Visible to gradient-checkpointing
    checks ] in ``scheduler.applying.visible``): peft refuses prefix tuning
    on such a model at once instead of failing in attention.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import torch
from torch import nn

from graphs import CkptError
from solvers import Plan, PlanMismatch

from ..tracing.tracer import EvalModeWarning
from ..tracing.spans import MODULES_META, TREE_META, parse_run_path
from .chunked import _Chunks, split_chunks
from .chunked import install as install_chunked
from .regions import RegionForward, SequentialRuns
from .visible import is_marked, mark, unmark

__all__ = ["apply", "remove", "applied_plan", "planned", "region_wrappers", "ApplyError", "RegionForward",
           "SequentialRuns"]

log = logging.getLogger(__name__)

_PLAN_ATTR = "_ckpt_plan"


class ApplyError(CkptError, RuntimeError):
    """A plan could not be applied to the module (the message says why and what to do)."""


# ------------------------------------------------------------------------- apply / remove
def apply(model: nn.Module, plan: Plan, *, check: bool = True) -> nn.Module:
    """Checkpoint, in place, the submodule calls ``plan``'s regions name; return ``model``.

    Args:
        model: the user's module (any mode, device or dtype; the plan is
            solved for its structure, not for one shape).
        plan: a plan whose regions are submodule calls (solved on a graph
            from ``scheduler.trace``, which records them).
        check: refuse a plan whose module paths, module classes or parameter
            count do not match ``model``.

    Returns:
        ``model`` itself, with the regions installed (a plan applied before
        is removed first). ``remove(model)`` undoes it.

    Raises:
        ApplyError: the plan has regions that are no submodule call.
        PlanMismatch: the plan was solved for another model (names the first
            missing or mismatched module path).

    Example:
        >>> graph = scheduler.trace(model, (tokens,), loss=lambda out: out.loss)
        >>> plan = scheduler.solve(graph, "6GiB", solver="ilp")
        >>> scheduler.apply(model, plan)   # then train as before
    """
    whole, chunked = plan, []
    if plan.chunks:  # NOTE [ Chunked head (applying) ]
        plan, chunked = split_chunks(plan)
    targets = _resolve(model, plan, check=check)
    if check and plan.graph_meta.get("training") is False and targets:
        warnings.warn(f"this plan was traced from {plan.graph_meta.get('model', 'a model')} in eval mode: training "
                      "steps hold dropout masks (and BatchNorm batch statistics) it did not count, so their memory can "
                      "be above its prediction. Trace the model after model.train() and solve again",
                      EvalModeWarning, stacklevel=2)
    remove(model)
    stochastic = _stochastic_flags(plan)
    save_ops = list(plan.save_ops) if plan.save_ops else [()] * len(targets)  # NOTE [ Selective checkpoint policies ]
    calls = list(plan.save_op_calls) if plan.save_op_calls else [()] * len(targets)
    runs: dict[str, list[tuple[int, int, str, bool]]] = {}
    run_ops: dict[str, dict[str, tuple[tuple, tuple]]] = {}
    for r, (path, module) in enumerate(targets):
        parsed = parse_run_path(path)
        if parsed is not None:
            parent, i, j = parsed
            runs.setdefault(parent, []).append((i, j, path, stochastic[r]))
            run_ops.setdefault(parent, {})[path] = (save_ops[r], calls[r])
            continue
        previous = module.__dict__.get("forward")
        module.forward = RegionForward(module, path, stochastic=stochastic[r], previous=previous, save_ops=save_ops[r],
                                       save_op_calls=calls[r])
        mark(module)  # NOTE [ Visible to gradient-checkpointing checks ]
    for parent, items in runs.items():
        module = model.get_submodule(parent)
        module.forward = SequentialRuns(module, items, previous=module.__dict__.get("forward"), save_ops=run_ops[parent])
        mark(module)
    _install_inner(model, plan, check=check)
    install_chunked(model, chunked)
    _record_marked(model)
    model.__dict__[_PLAN_ATTR] = whole
    log.info("applied %d checkpoint regions (%s) to %s", len(targets), plan.solver, type(model).__name__)
    return model


def _install_inner(model: nn.Module, plan: Plan, *, check: bool) -> None:
    """NOTE [ Nested regions ] in ``solvers.model.nested``: each inner region's call checkpointed on its own; the outer
    call, checkpointed around it, makes it (in its forward and in its recompute), so the checkpoints nest."""
    if not plan.inner:
        return
    if not plan.inner_modules or any(not m for m in plan.inner_modules):
        raise ApplyError("the inner regions of this plan name no submodule call (inner_modules); solve it again on a "
                         "graph from scheduler.trace")
    for path in plan.inner_modules:
        if parse_run_path(path) is not None:
            raise ApplyError(f"inner region {path!r} is a run of nn.Sequential children; an inner region is one "
                             "module call (NOTE [ The menu of inner regions ]): solve again")
    as_regions = dataclasses.replace(plan, regions=plan.inner, modules=plan.inner_modules,
                                     stochastic=plan.inner_stochastic, inner=(), inner_modules=(),
                                     inner_stochastic=(), saved=(), save_ops=(), save_op_calls=(), node_names=(),
                                     chunks=(), chunk_modules=())
    flags = list(plan.inner_stochastic) if plan.inner_stochastic else [True] * len(plan.inner)
    for (path, module), stochastic in zip(_resolve(model, as_regions, check=check), flags):
        if isinstance(module.__dict__.get("forward"), (RegionForward, SequentialRuns)):
            raise ApplyError(f"inner region {path!r} is also a region of the plan; an inner region lies strictly "
                             "inside its outer one (solve again)")
        module.forward = RegionForward(module, path, stochastic=stochastic, previous=module.__dict__.get("forward"))
        mark(module)


def _record_marked(model: nn.Module) -> None:
    """NOTE [ Regions under torch.compile ]: each wrapper knows the region modules at and under its module
    (a ``SequentialRuns``: under its children), whose flags it sets around its traced checkpoint."""
    for m in model.modules():
        wrapper = m.__dict__.get("forward")
        if isinstance(wrapper, RegionForward):
            wrapper.marked = tuple(x for x in m.modules() if is_marked(x))
        elif isinstance(wrapper, SequentialRuns):
            wrapper.marked = tuple(x for child in m.children() for x in child.modules() if is_marked(x))


def remove(model: nn.Module) -> nn.Module:
    """Undo :func:`apply`: every checkpointed submodule gets its own ``forward`` back."""
    for m in model.modules():
        wrapper = m.__dict__.get("forward")
        if isinstance(wrapper, (RegionForward, SequentialRuns, _Chunks)):
            previous = wrapper.previous
            while isinstance(previous, (RegionForward, SequentialRuns, _Chunks)):  # wrapped twice: every layer of ours goes
                previous = previous.previous
            if previous is None:
                del m.__dict__["forward"]
            else:
                m.__dict__["forward"] = previous
            unmark(m)  # NOTE [ Visible to gradient-checkpointing checks ]
    model.__dict__.pop(_PLAN_ATTR, None)
    return model


class _Planned(nn.Module):
    """``model`` with ``plan`` switched on for each call only (see :func:`planned`).

    NOTE [ A plan switched on for one step ]
        One-level regions keep their recompute after the call returns (the
        checkpoint holds the region's forward), so the plan is removed as the
        call returns and the next plain call of ``model`` is plain. An outer
        region's recompute (NOTE [ Nested regions ] in ``solvers.model.nested``)
        calls its inner modules again, looked up on the modules as it runs:
        removed, they ran plain and saved what the inner checkpoints did not
        (torch's ``CheckpointError``, "recomputed values ... have different
        metadata": ``verify`` on every nested plan). A plan with inner regions
        therefore stays applied until the backward of the call's outputs ends
        (a callback the autograd engine runs at the end of that backward,
        queued by a gradient hook on the outputs), or until the next call of
        this wrapper; a call whose outputs need no gradient removes it at once.
    """

    def __init__(self, model: nn.Module, plan: Plan) -> None:
        super().__init__()
        self.__dict__["model"] = model
        self.__dict__["plan"] = plan

    def _remove(self) -> None:
        if applied_plan(self.model) is self.plan:
            remove(self.model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._remove()  # a previous call whose backward never ran
        apply(self.model, self.plan, check=False)
        held = False
        try:
            out = self.model(*args, **kwargs)
            if self.plan.inner:
                held = self._remove_after_backward(out)
            return out
        finally:
            if not held:
                self._remove()

    def _remove_after_backward(self, out: Any) -> bool:
        """Remove the plan when the backward of ``out`` ends; False when nothing of ``out`` needs a gradient."""
        outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outs:
            return False
        queued = [False]

        def queue(_grads: Any) -> None:
            if not queued[0]:
                queued[0] = True
                torch.autograd.Variable._execution_engine.queue_callback(self._remove)

        torch.autograd.graph.register_multi_grad_hook(outs, queue, mode="any")
        return True


def planned(model: nn.Module, plan: Plan) -> nn.Module:
    """A callable that runs ``model`` with ``plan`` applied for that call only.

    For measuring a plan beside the same model without it, alternately
    (``verify``, ``ckpt compare``): the regions a call checkpointed keep
    their recompute after the call returns, so the backward that follows is
    the planned one, while the next plain call of ``model`` is not (a nested
    plan stays applied through that backward: NOTE [ A plan switched on for
    one step ]).
    """
    return _Planned(model, plan)


def applied_plan(model: nn.Module) -> Plan | None:
    """The plan :func:`apply` installed on ``model``, or None."""
    return model.__dict__.get(_PLAN_ATTR)


def region_wrappers(model: nn.Module) -> list[RegionForward | SequentialRuns]:
    """The installed region wrappers, in module order."""
    out = []
    for m in model.modules():
        wrapper = m.__dict__.get("forward")
        if isinstance(wrapper, (RegionForward, SequentialRuns)):
            out.append(wrapper)
    return out


def _stochastic_flags(plan: Plan) -> list[bool]:
    flags = list(plan.stochastic) if plan.stochastic else [True] * len(plan.regions)
    return flags


def _resolve(model: nn.Module, plan: Plan, *, check: bool) -> list[tuple[str, nn.Module]]:
    if not plan.regions:
        return []
    if check and not plan.fingerprint:
        raise PlanMismatch("this plan carries no fingerprint (built by hand or edited), so nothing says which model "
                           "it was solved for; solve it with scheduler.solve, or pass check=False to apply it anyway")
    if not plan.modules or any(not m for m in plan.modules):
        bad = [r for r, m in zip(plan.regions, plan.modules or [""] * len(plan.regions)) if not m]
        raise ApplyError(
            f"region(s) {bad[:3]} of this plan are no submodule call, so they cannot be hooked onto the module "
            "(the plan was solved on a graph without module spans: a hand-written or synthetic graph, or "
            "graph.unaligned()). Solve on a graph from scheduler.trace / ckpt trace, or apply the plan to a "
            "traced copy with scheduler.apply(model, plan, lower='graph', args=...)")
    classes = plan.graph_meta.get(MODULES_META) or {}
    out = []
    for path in plan.modules:
        parsed = parse_run_path(path)
        lookup = parsed[0] if parsed else path
        try:
            module = model.get_submodule(lookup)
        except AttributeError:
            raise PlanMismatch(
                f"this plan was solved for another model: it checkpoints {path!r}, and {type(model).__name__} "
                f"has no submodule {lookup!r} (the first missing module path). Trace and solve this model "
                "(ckpt trace / scheduler.trace)") from None
        if parsed is not None:
            if not isinstance(module, nn.Sequential) or len(module) <= parsed[2]:
                raise PlanMismatch(f"this plan was solved for another model: {lookup!r} is not an nn.Sequential with "
                                   f"{parsed[2] + 1} children or more, so the run {path!r} does not exist")
        if check and lookup in classes and classes[lookup]:
            # the trace records a class's qualified name (``make.<locals>.Net``, ``Outer.Block``), older plans its name
            names = {n for c in type(module).__mro__ for n in (c.__name__, c.__qualname__)}
            if classes[lookup] not in names:
                raise PlanMismatch(
                    f"this plan was solved for another model: {lookup!r} was a {classes[lookup]} and is a "
                    f"{type(module).__name__} here (the first mismatched module path); trace and solve this model")
        if check:
            _check_inside(model, path, lookup, parsed, plan.graph_meta.get(TREE_META))
        out.append((path, module))
    want = plan.graph_meta.get("parameters")
    if check and isinstance(want, int):
        have = sum(p.numel() for p in model.parameters())
        if have != want:
            raise PlanMismatch(
                f"this plan was solved for a model with {want:,} parameters and this one has {have:,} (another size "
                "or configuration); trace and solve this model, or pass check=False to apply it anyway")
    return out


def _check_inside(model: nn.Module, path: str, lookup: str, parsed: tuple[str, int, int] | None,
                  tree: Any) -> None:
    """NOTE [ What a region holds ]: the modules inside region ``path`` are those it was traced with."""
    if not isinstance(tree, dict) or not tree:
        return  # a plan from before the tree was recorded: the region's own class was compared
    roots = [f"{lookup}.{i}" if lookup else str(i) for i in range(parsed[1], parsed[2] + 1)] if parsed else [lookup]
    for root in roots:
        top = model.get_submodule(root)
        here = {".".join(x for x in (root, sub) if x): m for sub, m in top.named_modules(remove_duplicate=False)}
        here.pop("", None)  # the model itself (a region of the whole model) is not in the tree
        traced = {p: c for p, c in tree.items() if not root or p == root or p.startswith(root + ".")}
        for p, m in here.items():
            if p not in traced:
                raise PlanMismatch(
                    f"this plan was solved for another model: region {path!r} holds {p!r} (a {type(m).__name__}) that "
                    "the traced model did not have (the first module that differs; e.g. stochastic depth or an "
                    "adapter switched on since tracing). Trace and solve the model as it trains")
            if traced[p] not in {c.__name__ for c in type(m).__mro__}:
                raise PlanMismatch(
                    f"this plan was solved for another model: {p!r} inside region {path!r} was a {traced[p]} and is a "
                    f"{type(m).__name__} here (the first module that differs). Trace and solve the model as it trains")
        missing = [p for p in traced if p not in here]
        if missing:
            raise PlanMismatch(
                f"this plan was solved for another model: region {path!r} held {missing[0]!r} (a {traced[missing[0]]}), "
                "which this model does not have (the first module that differs). Trace and solve this model")
