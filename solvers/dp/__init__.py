"""The chain DP: ``dp``, the optimal dynamic program over a chain of stages.

* ``solver``: ``dp``, the registered solver; ``chain``: its table; ``fronts``: the
  Pareto sets the table holds and the buffer its kernel reads them from;
* ``limited``: ``dp`` under a wall-clock limit (NOTE [ dp under a time limit ]);
  ``work``: the table's work, counted before it is filled, and its pace under a deadline;
* ``profiles``: segment profiles, the memory model the program composes;
* ``selective``: the profile of a region that keeps nodes;
* ``nested``: the profile of a region nested with its child calls;
* ``kernel``: which merge kernel runs (numba's, or the plain copy while numba
  loads: NOTE [ The dp kernel under a deadline ]); ``_kernel``: that kernel.

May import ``graphs``, ``solvers.model`` and what is below it, and ``solvers.registry`` (``solver`` only).
"""

from .chain import DPTable, dp_table
from . import solver  # noqa: F401  (registers dp)

__all__ = ["DPTable", "dp_table"]
