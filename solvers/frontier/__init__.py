"""The frontier program: an exact dynamic program over the topological order.

Exact for graphs of narrow cut width; registered as ``frontier``, and the
first phase of ``ilp`` (NOTE [ One plan space ] in ``solvers.ilp``).

* ``program``: the program (NOTE [ The frontier DP ]) and its work bound;
* ``front``: its states and Pareto bookkeeping;
* ``kept``: regions that keep some nodes (selective recompute);
* ``nested``: regions whose child calls are checkpointed inside them (nested regions);
* ``regions``: what a region costs at a position (the terms ``kept``, ``nested`` and the blocks read);
* ``phases``: how ``ilp`` runs it (without, then with kept nodes) and its
  bounded-width heuristic for wide graphs.

May import ``graphs``, ``solvers.model`` and what is below it, ``solvers.dp.profiles`` (the segment
profiles it shares with dp), ``solvers.blocks`` and ``solvers.warm``; ``blocks`` builds on ``front``.
"""
