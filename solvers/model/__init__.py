"""The plan and the execution model: what a plan is, and what it costs.

Every solver returns a :class:`~solvers.model.plan.Plan` and every plan is
costed by :func:`~solvers.model.simulate.simulate`, the one cost model; no
solver lives here.

* ``plan``: the plan (regions, kept nodes, chunks, inner regions), its JSON file and its checks;
  ``parts``: its parts normalised and checked (regions, kept nodes, inner regions, save ops);
* ``simulate``: the execution model, step by step (NOTE [ Execution model ]);
  ``walk`` its one-level walk and the :class:`~solvers.model.walk.Simulation` it returns,
  ``nested_walk`` its walk of nested regions, ``meter`` its step meter, ``terms`` the per-graph
  terms it derives once, ``gradients`` the gradient rules every plan shares, ``overheads`` what a
  plan adds besides its recompute (NOTE [ Plan overheads ]);
* ``chunks``: what a chunked plan is: the calls that can run in chunks and the graph a plan's chunks
  expand to (NOTE [ Chunked head ]), ``rows`` how a call's rows split into chunks, ``fused`` the fused head
  (NOTE [ Fused head ]); ``nested``: what a nested plan is and the inner regions a region
  may nest (NOTE [ Nested regions ], NOTE [ The menu of inner regions ]);
* ``spans``: module-aligned regions; ``selective``: the kept sets a region may
  use; ``stages``: the chain structure (articulation cuts) the chain solvers cut at.

May import ``graphs`` and ``solvers.errors``, ``solvers.deadline``, ``solvers.options``; no solver, no
registry and no menu (``solvers.menus``): they all build on this package (``tests/test_layers.py``).
"""
