"""Measured forward times as the recompute cost (``capture(..., costs="time")``).

NOTE [ Time costs ]
    FLOPs price a recompute well on an accelerator running big matmuls, badly
    where memory-bound ops dominate: on a CPU step of the built-in GPT
    (4 layers, width 128, sequence 128) dropout is 0.1 % of the forward FLOPs
    and 28 % of the forward time, GELU 0.1 % and 9 %. A solver minimising
    FLOPs then recomputes dropouts and activations "for free" and the step is
    slower than a plan that recomputes more FLOPs.

    The default cost model prices that without running anything (NOTE
    [ Roofline costs ] in ``scheduler.tracing.roofline``); ``costs="time"``
    measures it instead, to calibrate the roofline or to plan for exactly
    this machine. The graph module is run forward with real tensors
    (gradients recorded, as a checkpoint's recompute does), ``repeats`` times
    after ``warmup`` runs, and each fx node's median wall time becomes its
    cost, ``fwd_cost`` (``fwd_flops`` stay the counted FLOPs). Times are
    written in *FLOP-equivalents*: scaled by the counted forward FLOPs over
    the measured forward time, so the totals stay comparable with a FLOP
    graph. ``meta["costs"]`` says so, keeps the measured nanoseconds and the
    rate (``flops_per_s``) that turns a cost back into seconds. Plans stay
    interchangeable: costs are not part of the fingerprint.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import Any, Sequence

import torch
import torch.fx

from .costs import OpRecord

__all__ = ["measure_node_times", "time_records", "COST_MODELS"]

log = logging.getLogger(__name__)

#: The values ``capture(costs=...)`` accepts; the first is the default.
COST_MODELS = ("roofline", "time", "flops")


class _Timer(torch.fx.Interpreter):
    """Runs the graph module and adds each node's wall time (ns) to ``times``."""

    def __init__(self, gm: torch.fx.GraphModule, times: dict[str, list[int]]) -> None:
        super().__init__(gm)
        self.times = times
        self.current: dict[str, int] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        t0 = time.perf_counter_ns()
        out = super().run_node(n)
        self.current[n.name] = self.current.get(n.name, 0) + time.perf_counter_ns() - t0
        return out


def measure_node_times(gm: torch.fx.GraphModule, flat_inputs: Sequence[Any], *, repeats: int = 5,
                       warmup: int = 1) -> dict[str, int]:
    """Median forward wall time (ns) of every fx node of ``gm`` on ``flat_inputs``.

    The forward runs with autograd recording (the graph is dropped after each
    run) and with the RNG state restored afterwards, so measuring does not
    change what the user's next step draws.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for v in flat_inputs:
        if isinstance(v, torch.Tensor) and v.device.type == "meta":
            raise ValueError("costs='time' measures real forward passes: the model is on the meta device; "
                             "use costs='roofline' (priced for a named device) or costs='flops' there")
    samples: dict[str, list[int]] = {}
    rng = torch.get_rng_state()
    try:
        for i in range(warmup + repeats):
            timer = _Timer(gm, samples)
            out = timer.run(*flat_inputs)
            del out
            if i >= warmup:
                for name, ns in timer.current.items():
                    samples.setdefault(name, []).append(ns)
    finally:
        torch.set_rng_state(rng)
    return {name: int(statistics.median(v)) for name, v in samples.items()}


def time_records(records: Sequence[OpRecord], times_ns: dict[str, int]) -> tuple[list[OpRecord], dict[str, Any]]:
    """``records`` with ``fwd_cost`` set to their measured time in FLOP-equivalents.

    Returns:
        ``(records, meta)``: ``meta`` is what goes in ``Graph.meta["costs"]``.
    """
    ns = [sum(times_ns.get(m, 0) for m in r.members) for r in records]
    flops = sum(r.fwd_flops for r in records)
    total_ns = sum(ns)
    if total_ns <= 0:
        return list(records), {"model": "flops", "why": "no forward time measured"}
    rate = max(flops, 1) / total_ns  # FLOP-equivalents per nanosecond
    out = [dataclasses.replace(r, fwd_cost=max(1, round(t * rate)))
           for r, t in zip(records, ns)]
    meta = {"model": "time", "device": "this machine (measured)", "forward_ns": total_ns, "flops_per_ns": rate,
            "flops_per_s": rate * 1e9, "counted_fwd_flops": flops}
    log.info("time costs: forward %.1f ms measured, %.3g FLOP-equivalents per ns", total_ns / 1e6, rate)
    return out, meta
