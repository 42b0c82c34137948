"""Reading a comparison: the plain-text table, progress lines, the machine, timelines."""

from __future__ import annotations

import platform
from typing import Any

import torch

from ..measuring.profiler import downsample
from ..report import table

__all__ = ["format_table", "progress_line", "machine", "timeline", "budget_label"]


def budget_label(r: Any) -> str:
    """``0.3`` for a fraction, ``=per-block`` for a budget matched to a peer's peak."""
    if r.budget is not None:
        return f"{r.budget:g}"
    return f"={r.matched_to}" if getattr(r, "matched_to", None) else ""


def machine() -> str:
    """One line: CPU model, cores torch uses, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads, {platform.system()} {platform.release()}"


def timeline(sim: Any, tr: Any, graph: Any = None) -> dict[str, Any]:
    """Predicted and measured live bytes through one step, on one x axis.

    The measured curve is placed by wall time (fraction of the step); the
    predicted one by the cost done so far (forward and recompute steps cost
    their node's ``fwd_flops``, backward steps its ``bwd_flops``), the
    simulator's stand-in for time, so the forward/backward turn and the
    recomputations line up with the measured events. Without ``graph`` each
    simulated step counts the same.
    """
    n = len(sim.live_bytes)
    if graph is not None and len(sim.steps) == n:
        nodes = graph.nodes
        cost = [max(1, nodes[i].bwd_flops if phase == "backward" else nodes[i].fwd_flops) for phase, i in sim.steps]
        total, acc, xs = float(sum(cost)), 0, []
        for c in cost:
            acc += c
            xs.append(acc / total)
    else:
        xs = [i / max(1, n - 1) for i in range(n)]
    px, py = downsample(xs, list(sim.live_bytes), 400)
    span = tr.times_s[-1] if tr.times_s and tr.times_s[-1] > 0 else 1.0
    return {"predicted_x": list(px), "predicted_bytes": list(py),
            "measured_x": [t / span for t in tr.times_s], "measured_bytes": list(tr.live_bytes)}


def _mib(b: int | None) -> str:
    return "" if b is None else f"{b / 2**20:.1f}"


def progress_line(r: Row) -> str:
    head = f"{r.method} {budget_label(r)}".rstrip()
    if r.reason:
        return f"{head}: not run: {r.reason}"
    return (f"{head}: peak {_mib(r.measured_peak_bytes)} MiB (predicted {_mib(r.predicted_peak_bytes) or '-'}), "
            f"time x{r.step_time_ratio:.3f}, grad diff {r.grad_max_abs_diff:.2g}")


def _extra(pred: float | None, meas: float | None) -> str:
    """Predicted and measured extra step time, in ms (``-`` where unknown)."""
    if pred is None and meas is None:
        return ""
    return "/".join("-" if v is None else f"{1e3 * v:.1f}" for v in (pred, meas))


def format_table(cmp: Comparison) -> str:
    """The comparison as a plain-text table, then the claims."""
    rows = []
    for r in cmp.rows:
        budget = budget_label(r)
        if not r.ran:
            rows.append((r.method, budget, _mib(r.predicted_peak_bytes), "", "", "", "", "", "", "", "", "",
                         f"not run: {r.reason}"))
            continue
        err = (f"{100 * (r.measured_peak_bytes / r.predicted_peak_bytes - 1):+.0f}%"
               if r.predicted_peak_bytes else "")
        rows.append((
            r.method, budget, _mib(r.predicted_peak_bytes), _mib(r.measured_peak_bytes), _mib(r.meter_peak_bytes), err,
            f"{r.step_time_ratio:.3f}",
            "" if r.recompute_ratio is None else f"{100 * r.recompute_ratio:.1f}%",
            "" if r.measured_recompute_ratio is None else f"{100 * r.measured_recompute_ratio:.1f}%",
            _extra(r.predicted_extra_s, r.measured_extra_s),
            "" if r.solve_time_s is None else f"{r.solve_time_s:.3f}",
            f"{r.grad_rel_diff:.1e}", r.note))
    head = ["method", "budget", "pred MiB", "meas MiB", "storages MiB", "err", "time x", "recomp pred", "recomp meas",
            "extra ms pred/meas", "solve s", "grad diff (rel)", "note"]
    lines = [table(rows, head)]
    for c in cmp.claims:
        lines.append(f"{'ok ' if c['holds'] else 'NO '} {c['claim']}: {c['detail']}")
    return "\n".join(lines)
