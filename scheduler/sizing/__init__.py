"""Sizing a step: budgets people write, the step's memory by category, the largest size that fits, the floor.

* ``budget``: ``"6GiB"``, bytes or a fraction, to bytes (NOTE [ Fractional budgets ]);
* ``memory``: persistent state and activations of a whole step (NOTE [ Bytes per parameter ]);
* ``floor``: the step no plan can make smaller (``explain_floor``);
* ``sized``: a model as ``size -> graph``; ``search``: the largest batch or sequence per solver (NOTE [ Size
  search ]); ``fit``: :func:`~scheduler.sizing.fit.fit`, that search for one card or a parallel layout
  (``scheduler.distributed.fit``); ``compiled``: the eager budget whose plan measures a target peak under
  ``torch.compile`` (NOTE [ Compile-aware budget ]; the measuring is passed in, no torch here).

May import ``graphs``, ``solvers``, ``scheduler.report``; ``budget``, ``memory`` and ``floor`` nothing else of
``scheduler`` (``scheduler.distributed`` builds on them), ``sized``, ``search`` and ``fit`` also the tracer and
``scheduler.distributed`` (``tests/test_layers.py``). No torch import here: ``sized`` imports it only when a model
is traced.
"""
