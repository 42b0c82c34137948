"""Apply a plan: cut the traced fx graph at the plan's regions and checkpoint each.

``apply(model, plan, args)`` re-captures ``model`` on ``args`` (the same
tracer that built the plan's graph), refuses a plan solved for another model,
shape or dtype, cuts the fx graph with ``torch.fx.passes.split_module`` into
consecutive partitions (one per region, one per stretch of nodes between
regions) and wraps every region partition in
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, the RNG
state preserved for regions that draw random numbers, which is the execution
model ``solvers.model.simulate`` costs (NOTE [ Execution model ], NOTE [ RNG state
per region ]).

This is the fallback applier (``scheduler.apply(..., lower="graph")``); the
default lowering onto the user's module is ``scheduler.applying``. Both follow
NOTE [ Stateful ops under recompute ] and NOTE [ Recompute at the region's
end ] in ``scheduler.applying.modules`` (here the buffers of a region's fx
submodule are snapshotted, and regions holding no stateful node and no
normalisation module skip the copy).

The returned :class:`CheckpointedModule` shares the model's parameter,
buffer and submodule dictionaries (same objects: an optimizer built before
``apply`` keeps working, ``state_dict`` keys are unchanged) and returns
outputs with the model's structure; with ``loss=`` the loss is part of the
traced graph (its regions may cover it), and the module returns
``loss(model(*args))``. A traced graph fixes the mode it was
traced in (train, dropout on); called in another mode or without autograd
(``torch.no_grad``, eval), the module runs the original model, since there
is nothing to checkpoint.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn
from torch.fx.passes.split_module import split_module
from torch.utils.checkpoint import checkpoint

from graphs import CkptError, Graph
from solvers import Plan

from .regions import _Probe  # one probe for both appliers (NOTE [ Recompute at the region's end ])

__all__ = ["apply", "ApplyError", "CheckpointRegion", "CheckpointedModule", "RegionInfo", "cut"]

log = logging.getLogger(__name__)


class ApplyError(CkptError, RuntimeError):
    """A plan could not be applied to the traced module."""


@dataclass(frozen=True)
class RegionInfo:
    """One checkpoint region of an applied plan.

    Attributes:
        region: the plan's ``(first, last)`` cost-node interval.
        submodule: attribute name of its partition in the split module.
        fx_nodes: number of fx nodes it covers.
        stateful: whether its buffers are snapshotted around recompute.
    """

    region: tuple[int, int]
    submodule: str
    fx_nodes: int
    stateful: bool


class CheckpointRegion(nn.Module):
    """Runs ``body`` under ``checkpoint(use_reentrant=False)``.

    See NOTE [ Stateful ops under recompute ] for ``stateful``.
    """

    def __init__(self, body: nn.Module, *, stateful: bool, stochastic: bool = True) -> None:
        super().__init__()
        self.body = body
        self.stateful = stateful
        self.stochastic = stochastic  # NOTE [ RNG state per region ] in solvers.model.terms
        self.recomputes = 0  # how many recomputes ran (for tests and verify)

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.body(*args)
        calls = 0
        probes: list[_Probe] = []

        def run(*a: Any) -> Any:
            nonlocal calls
            calls += 1
            probe = _Probe()  # the region's first saved tensor, in the forward and in the recompute
            if calls == 1:
                probes.append(probe)
                return self.body(*a)
            self.recomputes += 1
            if not self.stateful:
                return self.body(*a)
            buffers = list(self.body.buffers())
            saved = [b.detach().clone() for b in buffers]
            try:
                return self.body(*a)
            finally:
                with torch.no_grad():
                    for b, s in zip(buffers, saved):
                        b.copy_(s)

        out = checkpoint(run, *args, use_reentrant=False, preserve_rng_state=self.stochastic)
        probe = probes.pop()  # the checkpoint holds run(): the probe must not stay there (NOTE above)
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs:
            torch.autograd.graph.register_multi_grad_hook(outs, probe.unpack, mode="any")
        return out


class CheckpointedModule(nn.Module):
    """The model with the plan's regions checkpointed.

    Holds the model's own ``_parameters``, ``_buffers`` and ``_modules``
    dictionaries, so parameters, buffers, ``state_dict`` keys and submodules
    are the model's. ``split`` (the cut fx graph) is not a registered child.

    Attributes:
        plan: the applied plan.
        graph: the cost graph it was checked against.
        regions: one :class:`RegionInfo` per region.
    """

    def __init__(self, model: nn.Module, split: torch.fx.GraphModule, traced: Any, plan: Plan,
                 regions: Sequence[RegionInfo]) -> None:
        super().__init__()
        self.__dict__["_parameters"] = model._parameters
        self.__dict__["_buffers"] = model._buffers
        self.__dict__["_non_persistent_buffers_set"] = model._non_persistent_buffers_set
        self.__dict__["_modules"] = model._modules
        self.__dict__["model"] = model
        self.__dict__["split"] = split
        self.__dict__["traced"] = traced
        self.plan = plan
        self.graph = traced.graph
        self.regions = tuple(regions)
        self._traced_training = model.training
        self.train(model.training)

    def train(self, mode: bool = True) -> "CheckpointedModule":
        super().train(mode)
        self.model.training = mode
        return self

    def region_modules(self) -> list[CheckpointRegion]:
        return [getattr(self.split, r.submodule) for r in self.regions]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or self.training != self._traced_training:
            return self.model(*args, **kwargs)
        flat = self.traced.flatten_inputs(*args, **kwargs)
        return self.traced.unflatten_outputs(self.split(*flat))

    def extra_repr(self) -> str:
        return f"{len(self.regions)} checkpoint regions, plan by {self.plan.solver}"


def apply(model: nn.Module, plan: Plan, args: Any, kwargs: dict | None = None, *, loss: Any = None,
          granularity: Any = None, name: str | None = None, check: bool = True) -> CheckpointedModule:
    """Return ``model`` with the plan's regions run under activation checkpointing.

    Args:
        model: the user's module, in the mode it will be trained in.
        plan: a plan solved for the graph of ``model`` on inputs like ``args``.
        args: example positional inputs (same shapes and dtype as the plan's).
        kwargs: example keyword inputs.
        loss: the loss the plan's graph was traced with (passed to the tracer
            so that the fingerprint matches).
        granularity: the tracer's granularity; default: the one recorded in
            the plan's graph meta, else the tracer's default.
        name: the graph's name as it was traced (default: the model's class
            name, as :func:`scheduler.trace` does).
        check: refuse a plan whose fingerprint differs from the traced graph.

    Returns:
        A :class:`CheckpointedModule` sharing the model's parameters.

    Raises:
        PlanMismatch: the plan was solved for another model, shape or dtype
            (the message says which).
        PlanError: a region is out of range or holds a non-recomputable node.
        ApplyError: the plan's regions cannot be mapped onto the fx graph.
    """
    traced = _capture(model, args, kwargs, loss=loss, granularity=granularity, plan=plan, name=name)
    if check:
        plan.check_graph(traced.graph)
    else:
        plan.validate(traced.graph)
    split, regions = cut(traced, plan)
    log.info("applied %d regions (%s) to %s", len(regions), plan.solver, traced.graph.name)
    if plan.saved:
        log.warning("lower='graph' recomputes every region whole: the plan's %d kept op outputs (save_ops) are "
                    "applied only by the module lowering (the recompute costs what the regions alone cost)",
                    len(plan.saved))
    return CheckpointedModule(model, split, traced, plan, regions)


def cut(traced: Any, plan: Plan) -> tuple[torch.fx.GraphModule, list[RegionInfo]]:
    """Split ``traced.gm`` at the plan's region boundaries; wrap the regions.

    Returns:
        The split module (partitions ``submod_K`` called in order; region
        partitions replaced by :class:`CheckpointRegion`) and the regions.

    Raises:
        ApplyError: a cost node in a region has no fx node.
    """
    graph: Graph = traced.graph
    gm: torch.fx.GraphModule = traced.gm
    region_of = plan.region_of(len(graph))
    owner: dict[str, int] = {}
    for i, names in enumerate(traced.members):
        for name in names:
            owner[name] = i
    fx_names = {n.name for n in gm.graph.nodes}
    for r, (a, b) in enumerate(plan.regions):
        if not any(name in fx_names for i in range(a, b + 1) for name in traced.members[i]):
            raise ApplyError(
                f"region ({a}, {b}) [{graph.nodes[a].name} .. {graph.nodes[b].name}] has no node in the traced "
                "fx graph (it lies in the loss or in nodes the module does not run); solve again without it"
            )
    # Partition ids: a new one whenever the region status changes along the fx order.
    part: dict[str, int] = {}
    part_region: dict[int, int] = {}
    count: dict[int, int] = {}
    key, pid = None, -1
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        k = region_of[owner[node.name]] if node.name in owner else key
        if k is None:
            k = -1
        if k != key or pid < 0:
            pid += 1
            key = k
            if k >= 0:
                if k in part_region.values():
                    raise ApplyError(f"region {plan.regions[k]} is not contiguous in the fx graph; the trace's node "
                                     "members are out of order")
                part_region[pid] = k
        part[node.name] = pid
        count[pid] = count.get(pid, 0) + 1
    split = split_module(gm, gm, lambda n: part[n.name], keep_original_order=True)
    buffers = {id(t) for t in gm.buffers()}
    infos = []
    for pid, r in sorted(part_region.items()):
        name = f"submod_{pid}"
        body = getattr(split, name)
        _own_buffers(split, name, body, buffers)
        a, b = plan.regions[r]
        stateful = any(graph.nodes[i].stateful for i in range(a, b + 1)) or any(
            isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats for m in body.modules())
        stochastic = any(graph.nodes[i].stochastic for i in range(a, b + 1))
        setattr(split, name, CheckpointRegion(body, stateful=stateful, stochastic=stochastic))
        infos.append(RegionInfo(region=(a, b), submodule=name, fx_nodes=count[pid], stateful=stateful))
    _inline_stretches(split, {info.submodule for info in infos})
    _copy_inputs_written_later(split, {info.submodule for info in infos})
    return split, infos


def _own_buffers(split: torch.fx.GraphModule, name: str, body: torch.fx.GraphModule, buffers: set[int]) -> None:
    """Make the buffers a region reads attributes of its body, not arguments.

    NOTE [ Buffers inside a region ]: ``split_module`` passes every tensor
    ``get_attr`` (a ``torch.export`` graph reads parameters and buffers that
    way) to a partition as an argument. Non-reentrant ``checkpoint`` keeps its
    arguments for the recompute and checks their versions, so a BatchNorm's
    ``num_batches_tracked.add_(1)`` inside the region failed the recompute
    ("modified by an inplace operation"; transformers' ResNet), and the
    snapshot of NOTE [ Stateful ops under recompute ] (the body's buffers)
    missed them: the recompute would have updated the statistics twice. The
    same tensor object is registered on the body instead.
    """
    call = next((n for n in split.graph.nodes if n.op == "call_module" and n.target == name), None)
    if call is None:
        return
    holders = [n for n in body.graph.nodes if n.op == "placeholder"]
    if len(holders) != len(call.args) or call.kwargs:
        return
    keep = []
    for arg, holder in zip(call.args, holders):
        value = None
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            value = operator.attrgetter(str(arg.target))(split)
        if isinstance(value, torch.Tensor) and id(value) in buffers:
            attr = "buf_" + str(arg.target).replace(".", "_")
            body.register_buffer(attr, value)
            with body.graph.inserting_before(holder):
                read = body.graph.get_attr(attr)
            holder.replace_all_uses_with(read)
            body.graph.erase_node(holder)
        else:
            keep.append(arg)
    if len(keep) != len(call.args):
        dropped = [a for a in call.args if a not in keep]
        call.args = tuple(keep)
        for arg in dropped:
            if not arg.users:
                split.graph.erase_node(arg)
        body.recompile()
        split.recompile()


def _writes(node: torch.fx.Node, target: torch.fx.Node) -> bool:
    """``node`` writes ``target`` in place: an aten op with a mutable schema
    argument (torch.export) or a ``Tensor.x_`` method on it (torch.fx)."""
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).endswith("__") and bool(node.args) \
            and node.args[0] is target
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return False
    for a, value in zip(schema.arguments, node.args):
        if value is target and a.alias_info is not None and a.alias_info.is_write:
            return True
    return False


def _copy_inputs_written_later(split: torch.fx.GraphModule, regions: set[str]) -> None:
    """A region gets a copy of an input that the graph writes in place after the region.

    NOTE [ Inputs written after a region ]: checkpoint keeps a region's
    inputs for its recompute and checks their versions. BART builds its
    decoder inputs with ``masked_fill_`` on a tensor a region had read just
    before (``shifted == -100``), so that plan failed its recompute
    ("modified by an inplace operation"). The region now reads a copy made
    at the call (a few KiB of token ids there; not in the cost model). A
    region output that *views* such an input would view the copy, and writes
    through it would miss the original: the tracer keeps those views out of
    regions (NOTE [ Views of written storages ] in ``scheduler.tracing.build``).
    """
    graph = split.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    changed = False
    for call in list(graph.nodes):
        if call.op != "call_module" or call.target not in regions:
            continue
        args = list(call.args)
        for k, arg in enumerate(args):
            if isinstance(arg, torch.fx.Node) and any(order[u] > order[call] and _writes(u, arg) for u in arg.users):
                with graph.inserting_before(call):
                    args[k] = graph.call_function(torch.clone, (arg,))
                changed = True
        call.args = tuple(args)
    if changed:
        split.recompile()


def _inline_stretches(split: torch.fx.GraphModule, regions: set[str]) -> None:
    """Copy the partitions that are not regions back into the top-level graph.

    A call keeps its arguments alive until it returns, so a stretch run as one
    submodule would hold every tensor it reads (a U-Net's skip) to its end,
    where the model (and ``simulate``) frees each right after its last use.
    Inlined, the top-level graph's own code frees them as the model does.
    """
    graph = split.graph
    for call in list(graph.nodes):
        if call.op != "call_module" or call.target in regions:
            continue
        sub = getattr(split, call.target)
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        if call.kwargs or len(placeholders) != len(call.args):
            continue  # not a plain positional partition call: leave it as it is
        val_map: dict[torch.fx.Node, Any] = dict(zip(placeholders, call.args))
        before = set(graph.nodes)
        with graph.inserting_before(call):
            out = graph.graph_copy(sub.graph, val_map)
        for node in graph.nodes:
            if node not in before and node.op in ("get_attr", "call_module"):
                node.target = f"{call.target}.{node.target}"
        if isinstance(out, (tuple, list)):
            for user in list(call.users):
                if user.op == "call_function" and user.target is operator.getitem:
                    user.replace_all_uses_with(out[user.args[1]])
                    graph.erase_node(user)
        else:
            call.replace_all_uses_with(out)
        if not call.users:
            graph.erase_node(call)
    graph.lint()
    split.recompile()


# ------------------------------------------------------------------ the tracer
def _capture(model: nn.Module, args: Any, kwargs: dict | None, *, loss: Any, granularity: Any, plan: Plan,
             name: str | None) -> Any:
    from ..tracing.tracer import capture_for_plan

    return capture_for_plan(model, plan, args, kwargs, loss=loss, granularity=granularity, name=name)
