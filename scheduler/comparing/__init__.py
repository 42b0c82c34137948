"""``ckpt compare``: our plans and the tools people use today, measured side by side.

* ``run``: :func:`compare`, one workload traced once, every method measured the same way;
* ``peers``: no checkpointing, per-block, ``checkpoint_sequential``, ``torch.compile``;
* ``claims``: what a comparison is judged by, checked on its rows;
* ``tables``: the plain-text table, progress lines, the machine, timelines;
* ``plots``: PNG plots (matplotlib, the ``plot`` extra);
* ``workloads``: the models compared, at sizes a 2-core CPU measures.
"""
