"""``ckpt compare``: our plans and the tools people use today, measured side by side.

* ``rows``: a row, one method at one budget; ``choosing``: which plan is ours, and the re-solve below a peer's peak;
* ``run``: :func:`compare`, one workload traced once, every method measured the same way;
* ``headtohead``: our plan against one peer at that peer's measured peak;
* ``peers``: no checkpointing, per-block, ``checkpoint_sequential``, ``torch.compile``;
* ``claims``: what a comparison is judged by, checked on its rows;
* ``tables``: the plain-text table, progress lines, the machine, timelines;
* ``plots``: PNG plots (matplotlib, the ``plot`` extra);
* ``workloads``: the models compared, at sizes a 2-core CPU measures.

May import ``graphs``, ``solvers`` and the layers of ``scheduler`` below it (tracing, measuring, applying,
sizing, models); nothing imports it but ``scheduler.api`` (lazily), the CLI, tests and benchmarks
(``tests/test_layers.py``).
"""
