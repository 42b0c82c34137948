"""The CP-SAT model of ``ilp`` (OR-Tools), and ``cp-sat``, that model on its own.

OR-Tools is imported when a model is built, never on importing this package.

* ``model``: the exact model of ``simulate`` (NOTE [ An exact model of simulate ]
  in ``solvers.ilp``); ``same``: its "one region" literals; ``cuts``: valid
  inequalities; ``kept``: kept nodes; ``rng``: generator-state terms;
* ``run``: running a search (parameters, progress, Ctrl-C);
* ``solver``: the ``cp-sat`` solver.

May import ``graphs``, ``solvers.model`` and what is below it, ``solvers.warm`` (its warm starts) and
``solvers.dp.profiles``; ``ilp`` and ``cp-sat`` (registered in ``solvers.ilp``) build on it.
"""
