"""The plan and the execution model: what a plan is, and what it costs.

Every solver returns a :class:`~solvers.model.plan.Plan` and every plan is
costed by :func:`~solvers.model.simulate.simulate`, the one cost model; no
solver lives here.

* ``plan``: the plan (regions, kept nodes, chunks, inner regions), its JSON file and its checks;
* ``simulate``: the execution model, step by step (NOTE [ Execution model ]);
  ``meter`` its step meter, ``terms`` the per-graph terms it derives once,
  ``gradients`` the gradient rules every plan shares, ``nested_walk`` its walk of nested regions
  (NOTE [ Nested regions ] in ``solvers.nested``), ``overheads`` what a plan adds besides its
  recompute (NOTE [ Plan overheads ]);
* ``spans``: module-aligned regions; ``selective``: the kept sets a region may
  use; ``stages``: the chain structure (articulation cuts) the chain solvers cut at.
"""
