"""The step meter of ``simulate``: every step's live bytes, and the peak by category."""

from __future__ import annotations

from graphs import Graph

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"


class _Meter:
    """The timeline and the peak: every step's live bytes, by category at the highest."""

    def __init__(self, graph: Graph, record: bool) -> None:
        self.params = graph.param_bytes
        self.inputs = graph.input_bytes
        self.base = self.params + self.inputs
        self.record = record
        self.steps: list[tuple[str, int]] = []
        self.live: list[int] = []
        self.best = -1
        self.best_step = 0
        self.best_break: dict[str, int] = {}
        self.best_at: tuple[str, int] = (FORWARD, 0)
        self.act_peak = 0

    def step(self, phase: str, i: int, act: int, agrad: int, pgrad: int, transient: int) -> None:
        total = self.base + act + agrad + pgrad + transient
        a_only = act + agrad + transient
        if a_only > self.act_peak:
            self.act_peak = a_only
        if total > self.best:
            self.best = total
            self.best_step = len(self.live) if self.record else 0
            self.best_break = {"params": self.params, "inputs": self.inputs, "activations": act,
                               "activation_grads": agrad, "param_grads": pgrad, "workspace": transient}
            self.best_at = (phase, i)
        if self.record:
            self.steps.append((phase, i))
            self.live.append(total)
