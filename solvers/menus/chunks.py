"""Chunk menus: the chunk counts a chunked solve tries, what it skips, and the label of its answer.

NOTE [ Chunk menus ]
    ``scheduler.solve(graph, budget, chunks=..., mlp_chunks=...)`` names two
    menus of chunk counts: one for the tail (the LM head with its loss), one
    for every row-wise call (an MLP); :func:`solve_chunked` solves once per
    pair of counts (NOTE [ Chunked head ] in ``solvers.model.chunks``). Before any
    solve the menus are read against the graph:

    * a menu whose calls cannot run in chunks is skipped, the other kept: a
      stock GPT-2, whose MLPs end in dropout (random numbers: no MLP is
      row-wise), still runs its head in chunks under ``--chunks 1,2,4,8,16
      --mlp-chunks 1,2,4``. Why a menu was skipped is logged and kept in
      ``findings["chunks_skipped"]`` (the plan report prints it). Only when
      no menu that asks for chunks can be used is the solve refused
      (:class:`~solvers.model.chunks.ChunkError`, the reasons of each);
    * counts above the rows of their calls (NOTE [ Chunk counts and rows ]
      in ``solvers.model.chunks``) are dropped with the same note, before any
      chunked graph is built; a menu left with no count above 1 is skipped
      as above (a classifier's head over one image's row, its MLPs over
      patches), and refused, in one line naming the most chunks allowed,
      when nothing else is chunked (``--chunks 1000000``).

    The answer is the least recompute that fits over every pair. It is
    ``optimal`` only when that plan is proven optimal for its own pair and
    every other pair is proven to do no better: proven infeasible, proven
    optimal at a cost no lower, or with a proven lower bound no lower. A pair
    solved to ``feasible`` below the answer's cost (CP-SAT stopped at a gap on
    one count: Llama-2-7B with 16 chunks once sat at 86 % after 240 s), one
    whose search stopped at the time limit, or one only a heuristic said is
    infeasible, leaves the answer ``feasible``; its ``bound`` is then the
    least of the pairs' proven lower bounds where every pair has one (else
    None), its ``gap`` from that bound, and ``findings["menu_unproven"]``
    names the pairs that were not proven.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from typing import Any, Callable, Sequence

from graphs import CkptError, Graph

from ..deadline import Deadline, stopped
from ..errors import InfeasibleBudget
from ..model.chunks import (CHUNK_MENU, ChunkError, _count, _products, _split, chunk_entries, expand, find_calls,
                            find_tail, max_chunks)
from ..model.overheads import with_extra_time
from ..model.plan import Plan, Status
from ..model.simulate import simulate

__all__ = ["solve_chunked", "read_menus"]

log = logging.getLogger(__name__)


def _counts(menu: Sequence[int], name: str) -> list[int]:
    values = list(menu)
    if not values or any(isinstance(k, bool) or not isinstance(k, numbers.Integral) for k in values) \
            or min(values) < 1:
        raise ChunkError(f"{name} chunk counts are integers >= 1, got {values!r}")
    return sorted({int(k) for k in values})


def _capped(counts: list[int], most: int, what: str, notes: list[str], refused: list[str]) -> list[int]:
    """``counts`` without those above ``most``, said in ``notes``; a menu left with none above 1 is refused
    (in ``refused``, and ``[1]``)."""
    over = [k for k in counts if k > most]
    if not over:
        return counts
    kept = [k for k in counts if k <= most]
    if not any(k > 1 for k in kept):
        refused.append(f"{what} has at most {most} rows, so it runs in at most {most} chunks; "
                       f"got {', '.join(_count(k) for k in over)}")
        return [1]
    notes.append(f"{what}: counts {', '.join(_count(k) for k in over)} dropped, above its {most} rows")
    return kept


#: Last module-path names of the calls an example of :func:`_why_no_calls` prefers (an MLP, not an attention).
_MLP_NAMES = ("mlp", "ffn", "feed_forward", "feedforward", "intermediate", "fc")


def _why_no_calls(graph: Graph) -> str:
    """Why no call of ``graph`` is row-wise, with an MLP-like call (the innermost of two products or more, an
    MLP's name preferred) as the example."""
    def products(sp: Any) -> int:
        return sum(_products(graph.nodes[i]) for i in range(sp.first, sp.last + 1))

    reasons = []
    for sp in graph.spans:
        if products(sp) < 2 or any(inner is not sp and sp.first <= inner.first and inner.last <= sp.last
                                   and products(inner) >= 2 for inner in graph.spans):
            continue  # the innermost calls of two products or more: an MLP, not the block around it
        try:
            _split(graph, sp.first, sp.last, what=f"call {sp.module!r}", loss=False)
        except ChunkError as exc:
            reasons.append((not sp.module.rpartition(".")[2].lower().startswith(_MLP_NAMES), str(exc)))
    if reasons:
        return f"no call of this graph is row-wise, e.g. {min(reasons, key=lambda r: r[0])[1]}"
    return "no call of this graph is row-wise (one input, one output, row-wise ops only)"


def read_menus(graph: Graph, menu: Sequence[int], call_menu: Sequence[int]) -> tuple[list[int], list[int], list[str]]:
    """``(head counts, call counts, notes)``: the menus as :func:`solve_chunked` runs them (NOTE [ Chunk menus ]).

    Raises:
        ChunkError: a count is no integer >= 1, or no menu that asks for chunks can be used (no call that can run
            in chunks, or every count above 1 above the call's rows): the reason of each.
    """
    heads, calls = _counts(menu, "head"), _counts(call_menu, "MLP")
    notes: list[str] = []
    refused: list[str] = []
    if heads[-1] > 1:
        try:
            tail = find_tail(graph)
        except ChunkError as exc:
            refused.append(f"the head is not chunked: {exc}")
            heads = [1]
        else:
            heads = _capped(heads, max_chunks(graph, tail.first, len(graph) - 1),
                            f"the head {tail.head!r} with its loss", notes, refused)
    if calls[-1] > 1:
        found = find_calls(graph)
        if not found:
            refused.append(f"the MLPs are not chunked: {_why_no_calls(graph)}")
            calls = [1]
        else:
            most = min(max_chunks(graph, sp.first, sp.last) for sp in found)
            calls = _capped(calls, most, f"the row-wise calls ({found[0].module!r}, ...)", notes, refused)
    if refused and heads[-1] == 1 and calls[-1] == 1:
        raise ChunkError("; ".join(refused))
    for note in refused + notes:
        log.warning("chunks: %s", note)
    return heads, calls, refused + notes


def _lower_bound(outcome: Any) -> float | None:
    """A proven lower bound on the recompute of one pair's plans that fit: a plan's cost when it is proven
    optimal, its ``bound`` when it says one, infinity when the pair is proven infeasible; None when unknown."""
    if isinstance(outcome, Plan):
        if outcome.status == Status.OPTIMAL:
            return float(outcome.recompute_cost)
        return None if outcome.bound is None else float(outcome.bound)
    if isinstance(outcome, InfeasibleBudget) and outcome.proven and not outcome.scope:
        return math.inf
    return None


def _label(best: Any, outcomes: dict[tuple[int, int], Any]) -> Any:
    """``best`` labelled over the whole menu (NOTE [ Chunk menus ]): ``optimal`` only where every pair is proven
    to do no better."""
    if best.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return best
    bounds = {pair: _lower_bound(out) for pair, out in outcomes.items()}
    cost = best.recompute_cost
    unproven = [pair for pair, b in bounds.items() if b is None or b < cost]
    if not unproven:
        return best
    known = [b for b in bounds.values() if b is not None]
    bound = min(known) if len(known) == len(bounds) else None
    gap = None if bound is None else max(0.0, (cost - bound) / max(cost, 1))

    def said(out: Any) -> str:
        if isinstance(out, InfeasibleBudget):
            return "no plan found" if not out.proven else "infeasible among the plans its solver considers"
        if isinstance(out, CkptError):
            return "stopped at the time limit"
        return f"{out.status}" + ("" if out.gap is None else f" (gap {out.gap:.1%})")

    text = "; ".join(f"head {kh}, MLPs {kc}: {said(outcomes[(kh, kc)])}" for kh, kc in unproven)
    log.info("chunk menu: the answer is not proven over the menu (%s)", text)
    return dataclasses.replace(best, status=Status.FEASIBLE, bound=bound, gap=gap,
                               findings={**best.findings, "menu_unproven": text})


def solve_chunked(graph: Graph, budget_bytes: int, solve_one: Callable[..., Any],
                  menu: Sequence[int] = CHUNK_MENU, call_menu: Sequence[int] = (1,),
                  deadline: Deadline | None = None, fused_whole: bool = True) -> Any:
    """The cheapest plan over the chunk counts of ``menu`` (the tail) and ``call_menu`` (every row-wise call).

    ``solve_one(g, budget_bytes)`` solves one graph (a registered solver
    through ``solvers.solve``); each pair of counts is solved on
    :func:`~solvers.model.chunks.expand`, and the plan with the least total cost
    that fits wins (recompute plus the chunk loop and region calls: NOTE
    [ Plan overheads ]; ties: fewer chunks). With an exact ``solve_one`` the
    answer is optimal over the menus and every interval plan (NOTE [ Chunked
    head ]); it says ``optimal`` only where every pair proved it (NOTE
    [ Chunk menus ]).

    Under a ``deadline`` each pair is solved as ``solve_one(g, budget_bytes,
    limit_s)`` with an even share of what is left (``left / pairs left``; a
    pair done early leaves its rest to the next). Each once took all that
    was left: on a Llama (hidden 256, 4 layers, 2 x 512 tokens, 20 s) the
    head in one piece, at a budget only more chunks reach, searched for
    15 s and the head in 4 chunks, which fits, had 0.3 s: "no plan found".

    ``fused_whole``: a head count of 1 runs a fusable head fused, whole (NOTE [ Fused head ] in
    ``solvers.model.fused``); off where the caller asked for no head menu (``mlp_chunks=`` alone), whose
    head stays as traced.

    Raises:
        ChunkError: a count is not an integer >= 1, no menu that asks for chunks has a call for them, or all its
            counts are above the rows of their calls (:func:`read_menus`).
        InfeasibleBudget: no pair fits; its least feasible budget is the least over the menus.
    """
    heads, calls, notes = read_menus(graph, menu, call_menu)
    best, best_total, failures, stops = None, 0, [], []
    outcomes: dict[tuple[int, int], Any] = {}
    pairs = [(kh, kc) for kc in calls for kh in heads]
    for done, (kh, kc) in enumerate(pairs):
        chunks = chunk_entries(graph, kh, kc, fused_whole)
        try:
            g = expand(graph, chunks)
            plan = solve_one(g, budget_bytes) if deadline is None else \
                solve_one(g, budget_bytes, deadline.left() / (len(pairs) - done))
        except InfeasibleBudget as exc:
            outcomes[(kh, kc)] = exc
            failures.append(exc.replace(best_regions=None) if chunks else exc)  # positions of another graph
            continue
        except CkptError as exc:
            if not stopped(exc):
                raise
            log.info("chunks head %d, calls %d: %s", kh, kc, exc)  # NOTE [ One deadline ]
            outcomes[(kh, kc)] = exc
            stops.append(exc)
            continue
        if chunks:
            plan = dataclasses.replace(plan, chunks=chunks, fingerprint=graph.fingerprint(),
                                       graph_meta=graph.meta, findings={**plan.findings, "head_chunks": kh,
                                                                        "call_chunks": kc}).labelled(graph)
        # NOTE [ Plan overheads ]: the chunk loop priced, so more chunks win only where they pay
        sim = simulate(graph, plan, record=False)
        plan = dataclasses.replace(plan, findings=with_extra_time(plan.findings, sim))
        outcomes[(kh, kc)] = plan
        if best is None or sim.total_cost < best_total:
            best, best_total = plan, sim.total_cost
        log.info("chunks head %d, calls %d: recompute %d, total %d", kh, kc, plan.recompute_cost, sim.total_cost)
    if best is None:
        if stops:
            raise stops[0]
        closest = min(failures, key=lambda e: e.min_feasible_bytes)  # an InfeasibleBudget: the least floor
        raise closest
    if notes:
        best = dataclasses.replace(best, findings={**best.findings, "chunks_skipped": "; ".join(notes)})
    return _label(best, outcomes)
