"""How a comparison chooses our plan: which solvers keep nodes, which of several plans is ours, and
the re-solve below a peer's measured peak (``ckpt compare``, ``benchmarks/selective.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import solvers
from graphs import CkptError
from solvers import Plan

from .rows import Row

__all__ = ["selective_options", "pick_key", "plan_key", "solve_below"]


def selective_options(names: Sequence[str], opts: Mapping[str, Mapping[str, Any]], selective: bool | None = None
                      ) -> dict[str, dict[str, Any]]:
    """``opts`` with ``selective`` set for each solver in ``names`` that takes it (unless given there):
    ``selective`` when not None, else on: ``scheduler.apply`` lowers kept nodes to one selective-checkpoint
    policy per region (NOTE [ Selective checkpoint policies ] in ``scheduler.applying.selective``)."""
    on = True if selective is None else bool(selective)
    out = {k: dict(v) for k, v in opts.items()}
    for name in names:
        try:
            takes = any(o.name == "selective" for o in solvers.registry.solver_info(name).options)
        except CkptError:
            continue
        if takes:
            out.setdefault(name, {}).setdefault("selective", on)
    return out


def pick_key(plan: Plan) -> tuple:
    """How the best of several plans is picked: the predicted extra time, recompute plus overheads
    (``findings["extra_time_s"]``, NOTE [ Plan overheads ] in ``solvers.model.overheads``), else the solvers' own
    objective (``Plan.recompute_cost``: roofline time by default), then the lower predicted peak. FLOPs only where
    a plan has no cost."""
    extra = plan.findings.get("extra_time_s")
    if isinstance(extra, (int, float)) and not isinstance(extra, bool):
        return (extra, plan.peak_bytes if plan.peak_bytes is not None else 0)
    cost = plan.recompute_cost if plan.recompute_cost is not None else plan.recompute_flops
    return (cost if cost is not None else 0, plan.peak_bytes if plan.peak_bytes is not None else 0)


def plan_key(plan: Plan) -> tuple:
    """Plans that run the same: same regions and the same kept (selectively saved) nodes."""
    return (tuple(plan.regions), tuple(plan.saved or ()), tuple(plan.save_ops or ()))


def solve_below(run: Callable[[int, Row], Row], target: int, row: Row, *, metered: bool = False,
                measured_target: int | None = None, tries: int = 4, start: int | None = None) -> Row:
    """``run(budget, row)`` at ``target`` bytes, then again below it while the measured peak exceeds it.

    A plan solved at a peer's measured peak can measure a little above it
    (allocator rounding, eager lifetimes the graph misses); each retry lowers
    the budget by the excess, so the row that comes back is at or below the
    peer's peak when any try got there (else the last try, its note saying so).
    ``metered``: compare the storage count (``meter_peak_bytes``), as the target is one.
    ``measured_target``: also keep the profiler peak (``measured_peak_bytes``) at or below this
    (the peer's profiler peak, what the claims compare).
    ``start``: the first budget, when not ``target``: a peer's measured peak plus what the graph
    over-predicts that peer's own plan by (the first plan must be solvable where the peer's is).
    """
    budget, out = (target if start is None else start), row
    for i in range(max(1, tries)):
        out = run(budget, row)
        got = (out.meter_peak_bytes if metered else None) or out.measured_peak_bytes
        over = 0 if got is None else got - target
        if measured_target is not None and out.measured_peak_bytes is not None:
            over = max(over, out.measured_peak_bytes - measured_target)
        if not out.ran or got is None or over <= 0:
            if i:
                out = replace(out, note=f"{out.note}; re-solved {i}x below the target")
            return out
        budget -= max(over, 1 << 16)
    return replace(out, note=f"{out.note}; still above the target after {tries} solves")
