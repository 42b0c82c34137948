"""The page of ``benchmarks/compile.py`` (issue 35): every compile budget row beside ours, and what it shows."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["TITLE", "report", "claims"]

def _mib(b: Any) -> str:
    return f"{b / 2**20:.2f}" if isinstance(b, (int, float)) else "-"


def _ms(s: Any) -> str:
    return f"{s * 1e3:.1f}" if isinstance(s, (int, float)) else "-"


def _diff(d: Any) -> str:
    return "0" if d == 0 else (f"{d:.1e}" if isinstance(d, float) else "-")


TITLE = "Our plans compiled with inductor against torch.compile's activation memory budget"


def _pairs(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(m["model"], r["theirs"], r["ours"]) for m in doc["models"] if "rows" in m for r in m["rows"]]


def _wins(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    return bool(ours.get("reached")) and ours["peak_bytes"] <= theirs["peak_bytes"] and \
        ours.get("time_s", float("inf")) <= theirs["time_s"]


def _ties(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Slower, at no larger peak, by less than one round moves: the first quartile of ours over compile's, round by
    round, at or under 1."""
    q = ours.get("ratio_quartiles")
    return bool(ours.get("reached")) and ours["peak_bytes"] <= theirs["peak_bytes"] and "time_s" in ours and \
        q is not None and q[0] <= 1.0


def _ours_cell(o: dict[str, Any]) -> str:
    label = o.get("label", "floor plan" if o.get("at_floor") else "")
    notes = ([label] if label else []) + ([] if o.get("reached") else ["over"])
    return _mib(o["peak_bytes"]) + (f" ({', '.join(notes)})" if notes else "")


def _bound_cells(side: dict[str, Any]) -> str:
    """The compiled bound's cells: bound MiB, measured over it (NOTE [ Compiled peak bound ])."""
    b = side.get("bound") or {}
    if "bound_bytes" not in b:
        return f"{b.get('error', '-')} | - | "
    return f"{_mib(b['bound_bytes'])} | {side['peak_bytes'] / b['bound_bytes']:.3f} | "


def _plan_cell(o: dict[str, Any]) -> str:
    return f"{o['regions']}, {o['kept']}, {o.get('chunks', 1)}"


def report(doc: dict[str, Any]) -> str:
    """The Markdown page below its title and header."""
    lines = [
        f"torch {doc['torch']} ({doc['python']}: the venv of `thirdparty`, which has torchvision), inductor, "
        f"{doc['threads']} torch thread; our solver `{doc['solver']}` over regions and the calls they keep "
        "(saved under compile by torch's selective checkpoint, NOTE [ Kept calls under torch.compile ])"
        + (f"; allocator: {doc['allocator']}." if doc.get("allocator") else "."),
        "",
        "Each row: compile's own knob `torch._functorch.config.activation_memory_budget` at the row's fraction, "
        "and our plan for compile's measured peak as the target, found by the compile-aware budget "
        "(NOTE [ Compile-aware budget ], `scheduler/sizing/compiled.py`): solve at an eager budget, apply onto a copy "
        "of the model, compile with inductor at budget 1.0, measure; the next eager budget between the largest "
        "that measured at or under the target and the least that measured over it, where the line through "
        "those two plans' (predicted, measured) puts the target (bisection when it falls outside); at most "
        f"{doc.get('solves')} solves and {doc.get('compiles')} new compiles a row, plans measured for an earlier "
        "row reused; the model's largest families of module calls (each call a region: `each PATTERN`) measured "
        "too, and so are plans solved with the recompute priced as inductor runs it (`inductor's costs, k/n up the "
        "budgets`) and plans that keep what compile's partitioner keeps (`outermost calls, kernels kept`: the "
        "outermost module calls as regions, their GEMMs, convolutions, attention and lookups kept, less the "
        "cheapest to recompute per byte). Kept: the fastest plan measured at or under the target (each timed once compiled, "
        f"{doc.get('search_repeats', 0)} rounds; with no times, the least predicted recompute), else "
        "the lowest measured (`over`). Under our least feasible eager budget our least-peak plan, the floor's, is "
        "measured (`floor plan`). Language models' heads and losses in up to "
        f"{doc.get('chunks')} row chunks, and the eager budget searched again without chunks (each search with "
        "those limits; a plan compiled once), the faster plan of the two kept. Peaks: the allocator's (profiler memory events), whole step. Times: "
        f"median of {doc['repeats']} alternated rounds of the compiled unplanned step, compile's and ours "
        f"(a round's time the least of {doc.get('timed', 1)} calls); where ours is slower, the quartiles of "
        "ours over compile's round by round beside it. "
        "`pred`: our plan's `simulate` peak (an eager prediction). `bound`: the compiled peak bound (NOTE "
        "[ Compiled peak bound ], `scheduler/measuring/inductor.py`): the graphs inductor's own partitioner makes, "
        "read on fake tensors, every node's output freed after its last use, plus inductor's channels-last copies "
        "of the convolutions' weights and input; compile's rows (at their budget) and the unplanned step too. Gradients: the largest difference from the "
        "compiled unplanned step's over its largest gradient (0: bitwise). Dropout off.",
        "",
        "| model | budget | compile MiB | compile bound MiB | compile/bound | compile ms | compile grads | ours MiB | "
        "pred MiB | ours/pred | bound MiB | ours/bound | ours ms | ours/compile time | ours grads | solves, compiles | "
        "regions, kept calls, head chunks |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in doc["models"]:
        if "rows" not in m:
            lines.append(f"| {m['model']} |" + " |" * 15 + f" skipped: {m.get('skipped')} |")
            continue
        p = m["plain"]
        plain_ms = statistics.median(r["plain_time_s"] for r in m["rows"])
        lines.append(f"| {m['model']} | plain (1.0) | {_mib(p['peak_bytes'])} | {_bound_cells(p)}{_ms(plain_ms)} | 0 | "
                     f"| {_mib(p['predicted_bytes'])} | {p['peak_bytes'] / p['predicted_bytes']:.3f} | | | | | | | |")
        for r in m["rows"]:
            t, o = r["theirs"], r["ours"]
            head = f"| {m['model']} | {t['fraction']:g} | {_mib(t['peak_bytes'])} | {_bound_cells(t)}" \
                   f"{_ms(t['time_s'])} | {_diff(t['grad_diff'])} | "
            if "peak_bytes" not in o:
                lines.append(head + f"no plan ({o.get('reason') or 'floor ' + _mib(o.get('floor_bytes'))}) | | | | | "
                             f"| | | {o['solves']}, {o.get('compiles', 0)} | |")
                continue
            ratio = f"{o['time_s'] / t['time_s']:.3f}" if "time_s" in o else "-"
            lines.append(head + f"{_ours_cell(o)} | {_mib(o['predicted_bytes'])} | "
                         f"{o['peak_bytes'] / o['predicted_bytes']:.3f} | {_bound_cells(o)}{_ms(o.get('time_s'))} | {ratio} | "
                         f"{_diff(o.get('grad_diff'))} | {o['solves']}, {o.get('compiles', 0)} | {_plan_cell(o)} |")
        b = m["below"]
        head = f"| {m['model']} | ours below {doc.get('below', 0.9):g} x {_mib(m['least_theirs_bytes'])} | | | | | | "
        if "peak_bytes" in b:
            lines.append(head + f"{_ours_cell(b)} | {_mib(b['predicted_bytes'])} | "
                         f"{b['peak_bytes'] / b['predicted_bytes']:.3f} | {_bound_cells(b)}{_ms(b.get('time_s'))} | | "
                         f"{_diff(b.get('grad_diff'))} | {b['solves']}, {b.get('compiles', 0)} | {_plan_cell(b)} |")
        else:
            lines.append(head + f"no plan (floor {_mib(b.get('floor_bytes'))}) | | | | | | | | "
                         f"{b['solves']}, {b.get('compiles', 0)} | |")
    lines += ["", "## What it shows", ""] + claims(doc)
    lines += ["", "Model sizes: " + "; ".join(
        f"{m['model']} {m['options']}" + (f" ({m['graph_nodes']} nodes, plain compile {m['plain']['compile_s']:.0f} s, "
                                          f"{m['wall_s']:.0f} s in all)" if "rows" in m else "")
        for m in doc["models"]), ""]
    return "\n".join(lines)


def _model_line(m: dict[str, Any]) -> str:
    """One model's headline: the budgets ours wins, and ours below compile's least peak or not."""
    rows = [(r["theirs"], r["ours"]) for r in m["rows"]]
    won = [f"{t['fraction']:g}" for t, o in rows if _wins(t, o)]
    b, least = m["below"], m["least_theirs_bytes"]
    lowest = min([o["peak_bytes"] for _, o in rows if "peak_bytes" in o] + [b.get("peak_bytes", least + 1)])
    below = (f"below compile's least peak: {_mib(lowest)} MiB against {_mib(least)}" if lowest < least
             else f"not below compile's least peak ({_mib(lowest)} MiB at least against {_mib(least)})")
    return (f"- {m['model']}: ours at least as fast at no larger peak on {len(won)} of {len(rows)} budgets"
            f"{' (' + ', '.join(won) + ')' if won else ''}; {below}")


def _lowest(m: dict[str, Any]) -> str:
    ours = [r["ours"] for r in m["rows"]] + [m["below"]]
    ours = [o for o in ours if "peak_bytes" in o]
    if not ours:
        return ""
    o = min(ours, key=lambda o: o["peak_bytes"])
    over = o["peak_bytes"] - o["predicted_bytes"]
    return (f"; our lowest plan ({o['regions']} regions) measures {_mib(o['peak_bytes'])} MiB, "
            f"{_mib(abs(over))} {'over' if over > 0 else 'under'} its prediction {_mib(o['predicted_bytes'])}")


def claims(doc: dict[str, Any]) -> list[str]:
    """The headline lines: where ours is at least as fast at no larger peak, and where not, in numbers."""
    pairs = _pairs(doc)
    wins = [(n, t) for n, t, o in pairs if _wins(t, o)]
    won = ", ".join(f"{n}@{t['fraction']:g}" for n, t in wins) or "none"
    out = [f"- ours at least as fast at no larger peak: {len(wins)} of {len(pairs)} budgets ({won})"]
    ties = [(n, t) for n, t, o in pairs if not _wins(t, o) and _ties(t, o)]
    if ties:
        out.append(f"- and slower at no larger peak by less than the rounds move (ours over compile's round by round: "
                   f"its first quartile at or under 1): {len(ties)} more ("
                   + ", ".join(f"{n}@{t['fraction']:g}" for n, t in ties) + ")")
    for n, t, o in pairs:
        if _wins(t, o):
            continue
        if "peak_bytes" not in o:
            out.append(f"  - {n}@{t['fraction']:g}: no plan of ours at {_mib(t['peak_bytes'])} MiB (our least "
                       f"{_mib(o.get('floor_bytes'))} MiB)")
            continue
        why = []
        if o["peak_bytes"] > t["peak_bytes"]:
            least = f", our least prediction {_mib(o['floor_bytes'])} MiB" if "floor_bytes" in o else ""
            label = o.get("label", "floor plan" if o.get("at_floor") else "")
            plan = f" (our {label})" if label else ""
            why.append(f"ours {_mib(o['peak_bytes'])} MiB{plan} against {_mib(t['peak_bytes'])} after {o['solves']} "
                       f"solves{least}")
        if "time_s" in o and o["time_s"] > t["time_s"]:
            q = o.get("ratio_quartiles")
            spread = (f"; round by round {q[0]:.3f}-{q[2]:.3f}, quartiles" + (", 1 between them" if q[0] <= 1 <= q[2]
                                                                              else "")) if q else ""
            lower = (f", at {_mib(o['peak_bytes'])} MiB against {_mib(t['peak_bytes'])}"
                     if o["peak_bytes"] < t["peak_bytes"] else "")
            why.append(f"ours {_ms(o['time_s'])} ms against {_ms(t['time_s'])} ({o['time_s'] / t['time_s']:.3f}"
                       f"{spread}){lower}")
        out.append(f"  - {n}@{t['fraction']:g}: " + "; ".join(why))
    out += [_model_line(m) for m in doc["models"] if "rows" in m]
    below = [(m["model"], m["below"], m["least_theirs_bytes"]) for m in doc["models"] if "below" in m]
    out.append("- ours aimed below compile's least peak: " + "; ".join(
        f"{n} {_mib(b['peak_bytes'])} MiB against {_mib(least)}" if b.get("peak_bytes", least) < least
        else f"{n} not reached ({_mib(b.get('peak_bytes', b.get('floor_bytes')))} MiB against {_mib(least)})"
        for n, b, least in below))
    ours = [o for _, _, o in pairs if "peak_bytes" in o] + [b for _, b, _ in below if "peak_bytes" in b]
    under = [o for o in ours if o["peak_bytes"] <= o["predicted_bytes"]]
    ratios = [o["peak_bytes"] / o["predicted_bytes"] for o in ours]
    out.append(f"- our measured peak under inductor at or under our (eager) prediction: {len(under)} of {len(ours)} "
               f"plans kept (measured/predicted {min(ratios, default=0):.3f} to {max(ratios, default=0):.3f}); "
               "unplanned: " + ", ".join(f"{m['model']} {m['plain']['peak_bytes'] / m['plain']['predicted_bytes']:.3f}"
                                         for m in doc["models"] if "plain" in m))
    tried = {(m["model"], t[1], t[2]) for m in doc["models"] if "rows" in m
             for o in [r["ours"] for r in m["rows"]] + [m["below"]] for t in o.get("tries", ())}
    if tried:
        by = [(n, meas / pred) for n, pred, meas in tried]
        names = sorted({n for n, _ in by}, key=[m["model"] for m in doc["models"]].index)
        out.append(f"  - every plan the searches measured: {sum(r <= 1 for _, r in by)} of {len(by)} at or under "
                   "the prediction; largest measured/predicted per model: "
                   + ", ".join(f"{n} {max(r for k, r in by if k == n):.3f}" for n in names))
    out += _bound_claims(doc, ours, pairs)
    for m in doc["models"]:
        flat, p = m.get("plain", {}).get("flat"), m.get("plain", {})
        if flat:
            over = p["peak_bytes"] - p["predicted_bytes"]
            out.append(f"- {m['model']}: inductor's unplanned step measures {_mib(p['peak_bytes'])} MiB, "
                       f"{_mib(over)} over our prediction {_mib(p['predicted_bytes'])}; with inductor's layout "
                       f"optimization off {_mib(flat['peak_bytes'])} MiB "
                       f"({_mib(p['peak_bytes'] - flat['peak_bytes'])} MiB less; step {_ms(flat['time_s'])} ms "
                       f"against {_ms(flat['plain_time_s'])}): channels-last copies of the convolutions' inputs "
                       "and weights, made in the compiled forward and handed to the backward, which our eager "
                       "prediction does not count (the compiled bound does)" + _lowest(m))
    grads = [o.get("grad_diff") for o in ours if o.get("grad_diff") is not None]
    theirs = [t["grad_diff"] for _, t, _ in pairs]
    out.append(f"- gradients against the compiled unplanned step: ours at most {max(grads, default=0):.1e}, "
               f"compile's at most {max(theirs, default=0):.1e} (relative to the largest gradient)")
    return out


def _bound_claims(doc: dict[str, Any], ours: list[dict[str, Any]], pairs: list[tuple[str, dict[str, Any], dict[str, Any]]]
                  ) -> list[str]:
    """Measured against the compiled bound: ours kept, every plan measured, compile's rows, the unplanned steps."""
    def count(sides: list[tuple[int, int | None]]) -> str:
        read = [(m, b) for m, b in sides if b]
        ratios = [m / b for m, b in read]
        return (f"{sum(r <= 1 for r in ratios)} of {len(read)}" + (f" (measured/bound {min(ratios):.3f} to "
                                                                     f"{max(ratios):.3f})" if ratios else "")
                + (f", {len(sides) - len(read)} not read" if len(read) < len(sides) else ""))

    def of(side: dict[str, Any]) -> tuple[int, int | None]:
        return side["peak_bytes"], (side.get("bound") or {}).get("bound_bytes")

    tries = {(m["model"], t[2], t[4]) for m in doc["models"] if "rows" in m
             for o in [r["ours"] for r in m["rows"]] + [m["below"]] for t in o.get("tries", ()) if len(t) > 4}
    plain = [of(m["plain"]) for m in doc["models"] if "plain" in m]
    fused = [(o["peak_bytes"], o["bound"]["fused_bytes"]) for o in ours if "fused_bytes" in (o.get("bound") or {})]
    within = [abs(m / f - 1) for m, f in fused]
    counted = [m["model"] for m in doc["models"] if (m.get("plain", {}).get("bound") or {}).get("guaranteed") is False]
    return [f"- measured at or under the compiled bound (NOTE [ Compiled peak bound ], read on fake tensors, "
            f"nothing run): ours kept {count([of(o) for o in ours])}; every plan the searches measured "
            f"{count([(m, b) for _, m, b in tries])}; compile's own rows {count([of(t) for _, t, _ in pairs])}; "
            f"unplanned {count(plain)}",
            f"  - the fused estimate (pointwise chains not materialized; not a bound) on ours kept: within 10% on "
            f"{sum(w <= 0.10 for w in within)} of {len(within)}, measured over it on "
            f"{sum(m > f for m, f in fused)}"] + (
        [f"  - counted, not proven, where inductor's layout pass rewrites convolutions (their channels-last copies "
         f"counted; `guaranteed` False): {', '.join(counted)}"] if counted else [])
