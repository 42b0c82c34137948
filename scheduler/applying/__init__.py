"""Applying a plan: onto the user's own module (the default), or onto a traced copy (the fallback).

* :func:`apply` ``(model, plan)``: each region is one submodule call, whose
  ``forward`` is checkpointed in place (``scheduler.applying.modules``);
  ``remove(model)`` undoes it. The user's forward, loss and training loop
  stay as they are.
* ``apply(model, plan, lower="graph", args=..., kwargs=..., loss=...)``:
  re-trace ``model`` at the plan's shape and run the traced graph cut at the
  regions (``scheduler.applying.graph``), for plans whose regions are no submodule
  call (solved on ``graph.unaligned()``). That module runs one shape only.

May import ``graphs``, ``solvers`` and ``scheduler.tracing`` (spans, the re-traced fallback); never the
verbs, sizing's search or the comparison.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from solvers import Plan

from .modules import ApplyError, RegionForward, SequentialRuns, applied_plan, planned, region_wrappers, remove
from .modules import apply as apply_modules
from .selective import KeptOpsDropped, RegionPolicy
from ..tracing.recompute_scale import register_applier

register_applier(planned, applied_plan)  # NOTE [ Recompute timed in the step ]: a trace measures plans as they run

__all__ = ["apply", "remove", "applied_plan", "planned", "region_wrappers", "ApplyError", "RegionForward", "SequentialRuns",
           "RegionPolicy", "KeptOpsDropped", "LOWERINGS"]

#: How a plan can be applied.
LOWERINGS = ("module", "graph")


def apply(model: nn.Module, plan: Plan, *, lower: str = "module", check: bool = True, args: Any = None,
          kwargs: dict | None = None, **graph_options: Any) -> nn.Module:
    """Apply ``plan`` to ``model``.

    Args:
        model: the user's module.
        plan: the plan (``scheduler.solve`` / ``scheduler.load_plan``).
        lower: ``"module"`` (default): checkpoint submodule calls in place and
            return ``model``; ``"graph"``: return a new module running the
            re-traced graph cut at the regions (needs ``args``/``kwargs``
            at the plan's shape, and ``loss=`` when the graph had one).
        check: refuse a plan solved for another model.
        args, kwargs, graph_options: for ``lower="graph"`` only
            (``scheduler.applying.graph.apply``'s arguments).

    Raises:
        ApplyError: unknown ``lower``, or arguments that belong to the other lowering.
        PlanMismatch: the plan was solved for another model.
    """
    if lower == "module":
        if args is not None or kwargs is not None or graph_options:
            given = sorted(["args"] * (args is not None) + ["kwargs"] * (kwargs is not None) + list(graph_options))
            raise ApplyError(f"apply(..., lower='module') takes no {', '.join(given)}: the plan is applied onto the "
                             "module itself and works at any input shape; pass them with lower='graph' only")
        return apply_modules(model, plan, check=check)
    if lower == "graph":
        if args is None and kwargs is None:
            raise ApplyError("apply(..., lower='graph') needs example inputs at the plan's shape: args=(...) and/or "
                             "kwargs={...}")
        from .graph import apply as apply_graph

        return apply_graph(model, plan, args if args is not None else (), kwargs, check=check, **graph_options)
    raise ApplyError(f"lower={lower!r} is not one of {', '.join(LOWERINGS)}")
