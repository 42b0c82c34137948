"""Measuring real steps: peak memory, step time, gradients; and proving an applied plan.

* ``training``: one training step run the same way everywhere (grads cleared, the base tensors, the loop);
* ``storages``: peak bytes by live tensor storages (a dispatch mode), what
  ``solvers.model.simulate`` counts (NOTE [ Counting like simulate ]);
* ``profiler``: peak bytes, timeline and kernel FLOPs from the profiler's
  allocator events, which also see compiled code (NOTE [ Measuring with
  profiler events ]);
* ``steps``: a step's peak by either meter, its gradients against a reference, two steps timed;
* ``verification``: :func:`verify`, a step with and without a plan side by side (above ``scheduler.applying``);
* ``distributed``: each rank's peak on gloo, a plan applied on each.

May import ``graphs``, ``solvers`` and, below it, ``scheduler.tracing`` (the storage id) and ``scheduler.models``;
``verification`` and ``distributed`` also the applier (``tests/test_layers.py``).
"""
