"""Plan-space menus, above the solver registry: each expands the graph (or the plan) over a menu, asks the
registry for each member, and returns the best with a true label (``optimal`` only where every member proved it).

* ``chunks``: chunk counts for an LM head with its loss and for row-wise calls (NOTE [ Chunk menus ]);
* ``nested``: nestings of a plan's regions, and the solvers that are exact over them (NOTE [ Solving nested
  plans ]).

What a chunked or nested plan *is*, how it expands and how it runs, belongs to the execution model
(``solvers.model.chunks``, ``solvers.model.nested``); the kept-op menu a region may use is
``solvers.model.selective`` (NOTE [ The menu of kept sets ]), which the solvers search inside their own spaces.

May import everything of ``solvers`` below it (the model, the registry, the solvers) and ``graphs``; nothing of
``solvers`` imports it (``tests/test_layers.py``). ``scheduler.solve`` runs them.
"""
