"""Plain-text tables and summaries for the CLI (no dependency)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from graphs import Graph
from solvers import Plan, Simulation, format_bytes
from solvers.model.chunks import expand

__all__ = ["table", "plan_summary", "status_text", "simulation_summary", "ratio", "format_seconds", "recompute_line",
           "cost_model", "compact_modules", "checkpoints_line", "regions_table", "describe_target"]


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ratio(x: float) -> str:
    return f"{100 * x:.1f}%"


def format_seconds(s: float) -> str:
    """``0.0123`` -> ``12.3 ms`` (s, ms or us, three significant digits)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-6:.3g} us"


def cost_model(graph: Graph) -> str:
    """How the graph's recompute costs were made, e.g. ``roofline on H100`` ("" when unknown)."""
    costs = graph.meta.get("costs")
    if not isinstance(costs, dict) or "model" not in costs:
        return ""
    device = costs.get("device")
    return f"{costs['model']} on {device}" if device else str(costs["model"])


def describe_target(target: Mapping[str, Any] | None) -> str:
    """``H100 (CUDA sm 9.0, the default for a meta model; attention: cudnn x2)`` from ``graph.meta["target"]``."""
    if not target:
        return "unknown (a graph traced before targets were recorded)"
    kind = f"CUDA sm {target['capability']}" if target.get("capability") else str(target.get("kind", ""))
    parts = [p for p in (kind if kind != target.get("device") else "", str(target.get("reason", ""))) if p]
    attention = target.get("attention") or {}
    if attention:
        parts.append("attention: " + ", ".join(f"{k} x{v}" for k, v in sorted(attention.items())))
    return f"{target.get('device', '?')}" + (f" ({'; '.join(parts)})" if parts else "")


def recompute_line(graph: Graph, flops: int, time_s: float | None) -> str:
    """``recompute F FLOPs = X% overhead, predicted T (roofline on DEVICE)``."""
    step = graph.total_fwd_flops() + graph.total_bwd_flops()
    line = f"recompute {flops:.3e} FLOPs = {ratio(flops / step if step else 0)} of the step's FLOPs"
    if time_s is not None:
        line += f", predicted recompute time {format_seconds(time_s)}"
        model = cost_model(graph)
        line += f" ({model})" if model else ""
    return line


def simulation_summary(graph: Graph, sim: Simulation, budget_bytes: int | None = None) -> str:
    """The peak, where it happens and what it is made of (``graph``: the chunked graph of a chunked plan)."""
    node = graph.nodes[graph.index[sim.peak_node]]
    lines = [
        f"peak: {format_bytes(sim.peak_bytes)} ({sim.peak_bytes} bytes) during the {sim.peak_phase} of "
        f"{sim.peak_node}" + (f" [{node.module}]" if node.module else ""),
    ]
    if budget_bytes is not None:
        verdict = "fits" if sim.peak_bytes <= budget_bytes else "DOES NOT FIT"
        lines.append(f"budget: {format_bytes(budget_bytes)}: {verdict}")
    rows = [(k, format_bytes(v)) for k, v in sim.breakdown.items()]
    lines.append(table(rows, ["at the peak", "bytes"]))
    lines.append(recompute_line(graph, sim.recompute_flops, sim.recompute_time_s))
    return "\n".join(lines)


def compact_modules(paths: Sequence[str]) -> str:
    """Module paths in a short form: ``h.0.mlp, h.1.mlp, h.2.mlp, lm_head`` -> ``h.{0-2}.mlp, lm_head``.

    Paths that differ only in their last numeric component (a block's index) are
    grouped, in the order they first appear; "" (a region that is no single call) is ``-``.
    """
    groups: dict[str, list[int]] = {}
    for path in paths:
        parts = (path or "-").split(".")
        at = next((i for i in range(len(parts) - 1, -1, -1) if parts[i].isdigit()), None)
        if at is None:
            groups.setdefault(path or "-", [])
            continue
        key = ".".join(parts[:at] + ["{}"] + parts[at + 1:])
        groups.setdefault(key, []).append(int(parts[at]))
    out = []
    for key, idx in groups.items():
        if not idx:
            out.append(key)
        elif len(idx) == 1:
            out.append(key.replace("{}", str(idx[0])))
        else:
            out.append(key.replace("{}", "{" + _ranges(idx) + "}"))
    return ", ".join(out)


def _ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8``."""
    vals = sorted(set(values))
    runs: list[list[int]] = []
    for v in vals:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def checkpoints_line(plan: Plan) -> str:
    """``checkpoints 12 submodule calls: h.{0-11}`` (what ``apply`` hooks), or that it stores everything."""
    chunked = ""
    if plan.chunks:  # NOTE [ Chunked head ] in solvers.model.chunks
        chunked = "; runs " + ", ".join(f"{m or 'nodes %d..%d' % (a, b)} in {k} chunks"
                                       for (a, b, k), m in zip(plan.chunks, plan.chunk_modules or [""] * len(plan.chunks)))
    if not plan.regions:
        return "checkpoints nothing (store everything)" + chunked
    if not plan.modules:
        return f"checkpoints {len(plan.regions)} regions (no module paths: a graph without submodule calls)"
    kept = f", keeping {len(plan.saved)} op outputs inside them" if plan.saved else ""
    if plan.inner:  # NOTE [ Nested regions ] in solvers.model.nested
        inner = plan.inner_modules or tuple("nodes %d..%d" % r for r in plan.inner)
        chunked = f"; nested inside them: {len(plan.inner)} calls ({compact_modules(inner)})" + chunked
    return f"checkpoints {len(plan.regions)} submodule calls{kept}: {compact_modules(plan.modules)}{chunked}"


def regions_table(graph: Graph, plan: Plan) -> str:
    """One row per region: its submodule call (``Plan.modules``), its first and last graph nodes, its size."""
    graph = expand(graph, plan.chunks)  # a chunked plan's regions are positions of the chunked graph
    modules = plan.modules or ("",) * len(plan.regions)
    rows = [(f"[{a}, {b}]", m or "-", graph.nodes[a].name, graph.nodes[b].name, b - a + 1)
            for (a, b), m in zip(plan.regions, modules)]
    return table(rows, ["region", "submodule call", "first node", "last node", "nodes"])


def status_text(plan: Plan) -> str:
    """The plan's status and the set of plans it is proven optimal over, where the solver says
    (NOTE [ One plan space ] in ``solvers.ilp``): "optimal over regions and kept nodes", "feasible
    (optimal over regions only; kept nodes not searched: ...)"."""
    over = plan.findings.get("optimal_over")
    if over and plan.status == "optimal":
        return f"{plan.status} over {over}"
    if over:
        return f"{plan.status} (optimal over {over}; kept nodes {plan.findings.get('selective', 'not searched')})"
    return str(plan.status)


def extra_line(plan: Plan) -> str:
    """``predicted extra time T = recompute R + regions X + chunk_loop Y ...`` (NOTE [ Plan overheads ] in
    ``solvers.model.overheads``), or "" when the plan has no overheads priced."""
    f = plan.findings
    terms = [(k[len("extra_"):-len("_s")], v) for k, v in f.items()
             if k.startswith("extra_") and k.endswith("_s") and k not in ("extra_time_s", "extra_recompute_s")]
    if not isinstance(f.get("extra_time_s"), (int, float)) or not terms:
        return ""
    parts = [f"recompute {format_seconds(f.get('extra_recompute_s', 0.0))}"]
    parts += [f"{name.replace('_', ' ')} {format_seconds(v)}" for name, v in terms]
    return f"predicted extra time {format_seconds(f['extra_time_s'])} = " + " + ".join(parts)


def plan_summary(graph: Graph, plan: Plan) -> str:
    """Regions, predicted peak vs budget, overhead, solve time, status."""
    method = plan.findings.get("method")
    lines = [f"solver {plan.solver}" + (f" ({method})" if method and method != plan.solver else "")
             + f": status {status_text(plan)}" + (f" (gap {ratio(plan.gap)})" if plan.gap not in (None, 0.0) else "")
             + f", solved in {plan.solve_time_s:.3f}s"]
    if plan.peak_bytes is not None:
        budget = f" / budget {format_bytes(plan.budget_bytes)}" if plan.budget_bytes else ""
        loop = f" (loop {plan.loop}: the model's output {'held through' if plan.loop == 'held' else 'dropped before'} " \
            "backward)" if plan.loop else ""
        lines.append(f"predicted peak {format_bytes(plan.peak_bytes)}{budget}{loop}")
    if plan.recompute_flops is not None:
        lines.append(recompute_line(graph, plan.recompute_flops, plan.recompute_time_s))
    extra = extra_line(plan)
    if extra:
        lines.append(extra)
    lines.append(checkpoints_line(plan))
    for key, what in (("chunks_skipped", "chunk menus"), ("menu_unproven", "not proven over the chunk menu")):
        if plan.findings.get(key):  # NOTE [ Chunk menus ] in solvers.menus.chunks
            lines.append(f"{what}: {plan.findings[key]}")
    if plan.regions:
        lines.append(regions_table(graph, plan))
    return "\n".join(lines)
