"""Block composition: repeated blocks found by structure, each crossed by its own Pareto front.

* ``compose``: finding the blocks and composing the chain of them;
* ``front``: one block's Pareto front, summed up as the chain needs it.
"""
