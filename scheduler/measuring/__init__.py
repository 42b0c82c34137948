"""Measuring real steps: peak memory, step time, gradients; and proving an applied plan.

* ``storages``: peak bytes by live tensor storages (a dispatch mode), what
  ``solvers.model.simulate`` counts (NOTE [ Counting like simulate ]);
* ``profiler``: peak bytes, timeline and kernel FLOPs from the profiler's
  allocator events, which also see compiled code (NOTE [ Measuring with
  profiler events ]);
* ``verification``: :func:`verify`, a step with and without a plan side by side.
"""
