"""Tracing, torch -> graph: capturing an fx graph, measuring its nodes, grouping them.

The entry point is :mod:`scheduler.tracing.tracer` (``capture``, ``trace``, ``Traced``); the rest are its parts.

* ``capture``: ``torch.fx`` / ``torch.export`` into a normalised GraphModule,
  and the check against an eager run;
* ``costs``: per fx node FLOPs, bytes, saved tensors and flags, on fake tensors;
* ``build``: grouping measured nodes into cost-graph nodes (NOTE [ Merging nodes ]).

May import ``graphs``, ``solvers``, ``scheduler.sizing``, ``scheduler.distributed`` (tensor-parallel
activations) and ``scheduler.measuring``'s meters (eager lifetimes, workspaces); never the applier or the verbs.
"""
