"""Block composition: repeated blocks found by structure, each crossed by its own Pareto front.

* ``compose``: finding the blocks and composing the chain of them;
* ``front``: one block's Pareto front, summed up as the chain needs it.

May import ``graphs``, ``solvers.model``, ``solvers.dp.profiles`` and ``solvers.frontier.front`` (the
steps and held bytes the frontier program reads back); ``solvers.frontier.program`` builds on it.
"""
