"""The claims a comparison is judged by, checked on its measured rows.

* Against ``per-block`` and ``checkpoint_sequential``: among our plans whose
  measured peak is no larger than the peer's, the cheapest has a step-time
  ratio no larger than the peer's.
* Against ``torch.compile`` at budget ``f``: one of our plans at ``f`` has a
  lower measured peak, or one of ours at no larger peak is cheaper.

Each claim is a dict: ``claim`` (what is compared), ``holds`` (bool),
``detail`` (the numbers behind it).
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["claims"]


def _fmt(r: Any) -> str:
    at = f"@{r.budget:g}" if r.budget is not None else ""
    return f"{r.method}{at} {r.measured_peak_bytes / 2**20:.1f} MiB x{r.step_time_ratio:.3f}"


def _cheapest_under(ours: Iterable[Any], peak: int) -> Any | None:
    fits = [r for r in ours if r.measured_peak_bytes <= peak]
    return min(fits, key=lambda r: (r.step_time_ratio, r.measured_peak_bytes)) if fits else None


def claims(cmp: Any) -> list[dict[str, Any]]:
    """Check the comparison's claims (see the module docstring)."""
    ours = [r for r in cmp.rows if r.kind == "ours" and r.ran]
    out: list[dict[str, Any]] = []
    for peer in (r for r in cmp.rows if r.kind == "peer" and r.ran and r.method in ("per-block", "checkpoint_sequential")):
        best = _cheapest_under(ours, peer.measured_peak_bytes)
        claim = f"ours vs {peer.method}: no slower at no larger peak"
        if best is None:
            low = min(ours, key=lambda r: r.measured_peak_bytes, default=None)
            detail = f"{_fmt(peer)}; none of our plans measured at or below its peak" + (
                f" (our lowest: {_fmt(low)})" if low else "")
            out.append({"claim": claim, "holds": False, "detail": detail})
            continue
        out.append({"claim": claim, "holds": best.step_time_ratio <= peer.step_time_ratio,
                    "detail": f"{_fmt(best)} vs {_fmt(peer)}"})
    for comp in (r for r in cmp.rows if r.method == "torch.compile" and r.ran and r.budget is not None and r.budget < 1):
        claim = f"ours vs torch.compile @{comp.budget:g}: lower peak, or cheaper at no larger peak"
        same = [r for r in ours if r.budget == comp.budget]
        lowest = min(same, key=lambda r: r.measured_peak_bytes, default=None)
        if lowest is not None and lowest.measured_peak_bytes < comp.measured_peak_bytes:
            out.append({"claim": claim, "holds": True, "detail": f"lower peak: {_fmt(lowest)} vs {_fmt(comp)}"})
            continue
        best = _cheapest_under(ours, comp.measured_peak_bytes)
        if best is not None and best.step_time_ratio <= comp.step_time_ratio:
            out.append({"claim": claim, "holds": True, "detail": f"cheaper: {_fmt(best)} vs {_fmt(comp)}"})
            continue
        ref = lowest or best
        out.append({"claim": claim, "holds": False,
                    "detail": f"{_fmt(ref) if ref else 'no plan of ours ran'} vs {_fmt(comp)}"})
    return out
