"""Tracing internals: capturing an fx graph, measuring its nodes, grouping them.

The public API is :mod:`scheduler.tracer` (``capture``, ``trace``, ``Traced``).

* ``capture``: ``torch.fx`` / ``torch.export`` into a normalised GraphModule,
  and the check against an eager run;
* ``costs``: per fx node FLOPs, bytes, saved tensors and flags, on fake tensors;
* ``build``: grouping measured nodes into cost-graph nodes (NOTE [ Merging nodes ]).
"""
