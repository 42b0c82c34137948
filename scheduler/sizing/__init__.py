"""Sizing a step: budgets people write, the step's memory by category, the largest size that fits, the floor.

* ``budget``: ``"6GiB"``, bytes or a fraction, to bytes (NOTE [ Fractional budgets ]);
* ``memory``: persistent state and activations of a whole step (NOTE [ Bytes per parameter ]);
* ``search``: :func:`fit`, the largest batch or sequence per solver (NOTE [ Size search ]);
* ``floor``: the step no plan can make smaller (``explain_floor``).

No torch import here: ``search`` imports it only when a model is traced.
"""
