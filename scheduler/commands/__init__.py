"""The command line's commands, one module each (``ckpt trace``, ``solve``, ``simulate``, ``apply``, ``compare``,
``fit``, ``calibrate``, ``models``, ``demo``), their shared flags in ``common`` and the parallel layout's in
``layout``. May import all of ``scheduler`` (the top of the house, beside ``scheduler.cli``).
"""
