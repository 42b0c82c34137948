"""PNG plots of a comparison (needs matplotlib, the ``plot`` extra).

* ``<model>_pareto.png``: step-time ratio against measured peak, one line
  per method across budgets (the overhead/memory Pareto curve).
* ``<model>_timeline.png``: live bytes through one step, predicted by
  ``simulate`` and measured by the profiler, for no checkpointing and for
  our plan at the lowest budget, on a common 0..1 step-progress axis.
* :func:`plot_scaling`: solve time against graph size per solver, log-log.

Figures are small (about 6x4 inches at 80 dpi, well under 200 KB).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

from graphs import CkptError
from graphs.files import write_atomic

__all__ = ["plot_comparison", "plot_scaling"]

_DPI = 80


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CkptError("plots need matplotlib: pip install 'ckpt[plot]' (or pip install matplotlib)") from None
    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def plot_comparison(cmp: Any, folder: str) -> list[str]:
    """Write the Pareto and timeline plots of ``cmp`` into ``folder``; returns the paths."""
    plt = _plt()
    mib = 2.0 ** 20
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    groups: dict[str, list[Any]] = {}
    for r in cmp.rows:
        if r.ran:
            groups.setdefault(r.method, []).append(r)
    for method, rows in groups.items():
        rows = sorted(rows, key=lambda r: r.measured_peak_bytes)
        xs = [r.measured_peak_bytes / mib for r in rows]
        ys = [r.step_time_ratio for r in rows]
        style = "-o" if rows[0].kind == "ours" else ("--s" if len(rows) > 1 else "D")
        ax.plot(xs, ys, style, label=method, markersize=5)
    paths.append(_finish(plt, fig, ax, "measured peak (MiB)", "step time / no checkpointing",
                         f"{cmp.model}: overhead vs memory", os.path.join(folder, f"{_slug(cmp.model)}_pareto.png")))

    fig, ax = plt.subplots(figsize=(6, 4))
    for (name, tl), color in zip(cmp.timelines.items(), ("tab:blue", "tab:red", "tab:green")):
        ax.plot(tl["predicted_x"], [b / mib for b in tl["predicted_bytes"]], "--", color=color,
                label=f"{name} predicted")
        ax.plot(tl["measured_x"], [b / mib for b in tl["measured_bytes"]], "-", color=color, alpha=0.7,
                label=f"{name} measured")
    paths.append(_finish(plt, fig, ax, "progress through the step (measured: wall time; predicted: cost done)",
                         "live memory (MiB)",
                         f"{cmp.model}: memory through one step",
                         os.path.join(folder, f"{_slug(cmp.model)}_timeline.png")))
    return paths


def _finish(plt, fig, ax, xlabel: str, ylabel: str, title: str, path: str) -> str:
    """Label, save and close one figure; returns its path."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=_DPI))  # NOTE [ Output files ]
    plt.close(fig)
    return path


def plot_scaling(points: Mapping[str, Sequence[tuple[int, float]]], path: str, *, title: str = "solve time") -> str:
    """Log-log solve time against graph size, one line per solver.

    Args:
        points: solver name -> ``(nodes, seconds)`` pairs.
        path: the PNG to write.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in sorted(points.items()):
        pts = sorted((n, max(s, 1e-6)) for n, s in pts)
        if pts:
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], "-o", markersize=4, label=name)
    ax.set_xlabel("graph nodes")
    ax.set_ylabel("solve time (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=_DPI))  # NOTE [ Output files ]
    plt.close(fig)
    return path
