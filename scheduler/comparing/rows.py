"""A comparison's row: one method at one budget, what was predicted and what was measured."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Row"]


@dataclass(frozen=True)
class Row:
    """One method at one budget.

    Attributes:
        method: solver name (ours) or peer name.
        kind: ``ours`` or ``peer``.
        budget: fraction of the store-all activation peak, None when the
            method takes none.
        matched_to: for our rows solved with a peer's measured peak as the
            budget, that peer (``per-block``, ``torch.compile@0.5``).
        predicted_peak_bytes: ``simulate``'s peak (ours; peers whose regions
            map onto the graph).
        measured_peak_bytes: profiler peak of a real step.
        meter_peak_bytes: the same step measured by ``scheduler.measuring.storages``
            (a dispatch mode: eager methods only, the cross-check).
        step_time_ratio: median step time / median un-checkpointed step time.
        step_time_s: median step time.
        recompute_ratio: predicted recompute FLOPs / step FLOPs.
        recompute_flops: predicted recomputed FLOPs (ours; peers mapped onto the graph).
        recompute_cost: the solver's objective for the plan (``Plan.recompute_cost``: roofline
            FLOP-equivalents by default, FLOPs with ``costs="flops"``).
        predicted_extra_s: the predicted recompute time (``Simulation.recompute_time_s``: the
            cost at the graph's rate), what the plan should add to a step.
        measured_extra_s: median step time less the median un-checkpointed step time, both
            from the same alternated run.
        measured_recompute_ratio: FLOPs that really re-ran / step FLOPs: eager methods by a
            FLOP count below the selective modes (NOTE [ Counting what a selective policy
            served ]: a kept call served from the store is not recomputed), compiled
            ones by the profiler's matmul/conv kernels.
        served_calls: calls a selective policy served from its store in the recompute (ours).
        solve_time_s: solver wall time (ours).
        grad_max_abs_diff: largest |grad - reference grad| over parameters.
        grad_rel_diff: the same over the largest |reference grad|.
        regions: number of checkpoint regions (ours).
        note: what was run (blocks, segments, config, "same plan as dp").
        reason: why the method did not run (all numbers None then).
    """

    method: str
    kind: str
    budget: float | None = None
    matched_to: str | None = None
    predicted_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None
    meter_peak_bytes: int | None = None
    step_time_ratio: float | None = None
    step_time_s: float | None = None
    recompute_ratio: float | None = None
    recompute_flops: int | None = None
    recompute_cost: int | None = None
    predicted_extra_s: float | None = None
    measured_extra_s: float | None = None
    measured_recompute_ratio: float | None = None
    served_calls: int | None = None
    solve_time_s: float | None = None
    grad_max_abs_diff: float | None = None
    grad_rel_diff: float | None = None
    regions: int | None = None
    note: str = ""
    reason: str | None = None

    @property
    def ran(self) -> bool:
        return self.reason is None and self.measured_peak_bytes is not None
