"""A chunked call's loop timed at its own shape, on the traced model's own modules.

NOTE [ Chunk loops timed at their shapes ]
    The chunk terms of NOTE [ Plan overheads ] (``solvers.model.overheads``)
    price a chunked call from figures measured on other shapes: a head's
    products at 256 x 16384 (``gemm_rows``), a chain of small ops, an add
    over the parameters at the machine's bandwidth. On this project's CPU they
    came out at a third to a half of what a chunked head adds to a real step
    (``benchmarks/results/time.md`` at ``35e21c0``: a 256-row, 32,000-word
    head in 2 chunks predicted 5.3 ms, measured 20 ms, CPU time): the
    head's own products ran slower over 128 rows than over 256 (its weight is
    ``[32000, 256]``, read transposed; the table's is not), and autograd's
    first addition of the weight gradient is out of place.

    So a trace for this CPU, with roofline costs, times each chunkable call of
    the graph (the tail, head and loss, ``find_tail``; the row-wise calls,
    ``find_calls``) as a plan would run it: on the model's own module, on an
    input of the traced shape and dtype (random; labels random over the
    vocabulary), forward and backward, whole (the head and transformers'
    loss; the call) and in each of :data:`COUNTS` chunks that its rows allow,
    through the loop the applier runs (``scheduler.tracing.chunk_loop``,
    shared with ``scheduler.applying.chunked``; no chunk checkpointed; a
    fused head's fused loop, NOTE [ Fused head ] in ``solvers.model.fused``,
    and the fused head whole as well, its count 1, which computes the
    gradients in the forward and is faster than the head as traced:
    priced at 0, a Llama head at hidden 512 fused whole measured 3.9-6.9
    ms under the traced one, isolated and in the step). The
    caches are flushed before each run (in a step the head's weight comes
    from memory, not from the last run); two warm-up passes over the counts
    (the first grows the heap: its runs fault pages in), then up to
    :data:`ROUNDS` rounds in alternating order, as many as :data:`BUDGET_S`
    holds at the warm-up's pace (:data:`MIN_ROUNDS` at least; none started
    once the wall clock has run three budgets), each count's least time
    kept (interference only adds). A call whose pass over the counts takes
    over :data:`MAX_PASS_S` is left to the formula: inside the chunked suite
    (sequences up to 4,096 tokens, beside another suite) one trace spent
    81 s timing a single head, and those heads, at thousands of rows a
    chunk, came out at 0 ms for 2 and 4 chunks. A count's figure is its least
    time less the whole call's, at least 0. Where torch computes on one
    thread a run is timed by its thread's CPU time (:func:`run_clock`): by
    the wall clock, a trace inside the time suite, beside another suite on
    2 cores, priced a Llama head in 2 chunks at 76.8 ms, which adds 15 to a
    step (``time.md`` at ``c95c724``): another process held the core through
    the rounds; CPU time does not move with that. A run that faulted pages
    in counts only where every run of its count did: on this machine the
    kernel takes back heap pages the allocator kept (about 110 ms of system
    time to fault 32 MB in again), which a step on a caching allocator does
    not pay, and the fault counter says which runs did. On a 256-row, 32,000-word Llama head at one
    thread three traces gave 12.6-12.9 ms for 2 chunks and 44-46 ms for 4,
    where a single pass per round had given 7-126 ms. The figures are stored
    in ``graph.meta["costs"]["chunk_times"]``, ``{call: {k: seconds}}``, the
    call named as plans name it (``lm_head+loss``, ``model.layers.0.mlp``),
    and price the loop in place of the four formula terms (``chunk_timed``);
    a count between or beyond the timed ones is read off the line through
    its neighbours (8 and 16 chunks: through 2 and 4).

    A call like one already timed (the same module class, input shape and
    parameters: every layer's MLP) takes its figures; once :data:`TOTAL_S`
    is spent, the calls left are priced by the formula (the tail comes
    first). The parameters' gradients and the RNG are as they were after it; a
    call whose whole run is estimated (FLOPs at the graph's rate) above
    :data:`MAX_RUN_S`, or that cannot be built (another input kind, a
    parameter off the CPU), is left to the formula, as is every call of a
    trace for a GPU or a meta model. Which traces time them is read from
    ``op_classes.json`` beside NOTE [ Measured op classes ] (``"chunk_loops":
    false`` times none; absent: on), so the test suite, which reads no clock,
    times none (``tests/conftest.py``); tests of this module inject a clock.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

from graphs import COSTS_META, LM_HEADS_META, Graph
from solvers.model.chunks import LOSS_SUFFIX, ChunkError, find_calls, find_tail, max_chunks
from solvers.model.fused import fused_heads, fused_layer, is_fused
from solvers.model.overheads import CHUNK_TIMES_KEY

from .calibration import cache_dir
from .chunk_loop import chunked_head_loss, fusable, fused_head_loss, over_chunks
from .opclasses import CacheFlush, no_collection, run_clock

__all__ = ["COUNTS", "ROUNDS", "MIN_ROUNDS", "FAULTS", "MAX_PASS_S", "BUDGET_S", "TOTAL_S", "MAX_RUN_S", "run_clock", "times_chunk_loops", "time_chunk_loops", "with_chunk_times"]

log = logging.getLogger(__name__)

#: The chunk counts timed (those of ``solvers.model.chunks.CHUNK_MENU`` above 1).
COUNTS = (2, 4)
#: The most timed rounds over the counts after their warm-up (each count's least time is kept).
ROUNDS = 9
#: The seconds the timed rounds of one call may take, at its warm-up's pace (at least :data:`MIN_ROUNDS` run).
BUDGET_S = 6.0
#: The seconds a trace spends timing chunk loops: the calls after that are priced by the formula (the tail first).
TOTAL_S = 12.0
#: The fewest timed rounds, whatever the budget.
MIN_ROUNDS = 5
#: The pages a timed run may fault in and still count (more: the kernel had taken back memory the heap kept, and
#: the run paid to fault it in again, which a step on a caching allocator does not).
FAULTS = 64
#: The most seconds one pass over the counts (the call whole, in 2 and in 4 chunks) may take to be timed.
MAX_PASS_S = 1.5
#: A call estimated to run longer than this, forward and backward, whole, is not timed (the formula prices it).
MAX_RUN_S = 0.75

_FILE = "op_classes.json"


def times_chunk_loops(cache: str | os.PathLike | None = None, key: str = "chunk_loops") -> bool:
    """Whether a CPU trace times its chunk loops: ``op_classes.json``'s ``chunk_loops`` (absent: yes); another
    ``key`` says so of another timing (``recompute_scale``: NOTE [ Recompute timed in the step ])."""
    path = os.path.join(cache_dir(cache), _FILE)
    if not os.path.exists(path):
        return True
    try:
        with open(path, encoding="utf-8") as fh:
            return bool(json.load(fh).get(key, True))
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("op classes file %s is unreadable (%s); timing as by default (%s)", path, exc, key)
        return True


def _kind(graph: Graph, head: str) -> str | None:
    """``causal`` or ``masked`` for the LM model ``head`` lies in (NOTE [ Which heads run in chunks ])."""
    known = graph.meta.get(LM_HEADS_META) or {}
    parts = head.split(".")
    for depth in range(len(parts)):
        kind = known.get(".".join(parts[:depth]))
        if kind in ("causal", "masked"):
            return kind
    return None


def _entry_value(graph: Graph, members: Sequence[Sequence[str]], fx: Mapping[str, Any], first: int,
                 last: int) -> Any:
    """The traced value (a fake tensor) the call ``first..last`` reads from before it, or None."""
    entry = sorted({j for i in range(first, last + 1) for j in graph.preds[i] if j < first})
    values = [fx[members[j][-1]].meta.get("val") for j in entry if members[j] and members[j][-1] in fx]
    shapes = {tuple(v.shape) for v in values if hasattr(v, "shape") and v.is_floating_point()}
    return next((v for v in values if hasattr(v, "shape") and v.is_floating_point()), None) if len(shapes) == 1 \
        else None


def _vocabulary(graph: Graph, members: Sequence[Sequence[str]], fx: Mapping[str, Any]) -> int | None:
    """The classes the graph's loss reads (its logits' last dimension)."""
    node = fx.get(members[-1][-1]) if members and members[-1] else None
    logits = node.args[0] if node is not None and node.args else None
    val = getattr(logits, "meta", {}).get("val") if logits is not None else None
    return int(val.shape[-1]) if val is not None and len(val.shape) >= 1 else None


def _page_faults() -> int:
    """The pages this process has faulted in so far (minor and major), or 0 where the C library does not say."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return 0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return int(usage.ru_minflt + usage.ru_majflt)


def _seconds(run: Callable[[int], None], counts: Sequence[int], clock: Callable[[], float], rounds: int,
             flush: Callable[[], None] = lambda: None, budget_s: float = BUDGET_S,
             wall: Callable[[], float] | None = None, faults: Callable[[], int] = _page_faults
             ) -> dict[int, float] | None:
    """What ``run(k)`` adds to ``run(counts[0])`` (the call whole) for each later k of ``counts``: each count's least time
    by ``clock`` over the rounds, in alternating order, the caches flushed before each run, less the whole
    call's. A run that faulted pages in (more than :data:`FAULTS`) counts only where every run of its count did.
    After a warm-up of two passes over the counts, as many rounds as ``budget_s`` holds at the second pass's pace
    by the ``wall`` clock (``clock`` where not given), :data:`MIN_ROUNDS` to ``rounds``, and none started once
    the wall clock has run three times ``budget_s`` (two at least). None, after one or two passes, for a call
    whose pass takes more than :data:`MAX_PASS_S` by ``clock`` (the first pass may take twice that: it grows the
    heap): too slow to time, it is priced by the formula."""
    wall = wall or clock
    started = wall()
    pace = 0.0
    for p in range(2):  # the first pass grows the heap to what the loops take; the second is at its pace
        pace, spent = 0.0, 0.0
        for k in counts:
            t0, c0 = wall(), clock()
            run(k)
            pace += wall() - t0
            spent += clock() - c0
        if spent > MAX_PASS_S * (2 - p):
            return None
    rounds = max(min(MIN_ROUNDS, rounds), min(rounds, int(budget_s / pace) if pace > 0 else rounds))
    best = {k: math.inf for k in counts}
    faulted = {k: math.inf for k in counts}
    for r in range(rounds):
        if r >= 2 and wall() - started > 3 * budget_s:  # a loaded machine: what the rounds so far say
            break
        for k in (counts if r % 2 == 0 else tuple(reversed(counts))):
            flush()
            f0 = faults()
            t0 = clock()
            run(k)
            t = clock() - t0
            if faults() - f0 > FAULTS:
                faulted[k] = min(faulted[k], t)
            else:
                best[k] = min(best[k], t)
    best = {k: best[k] if math.isfinite(best[k]) else faulted[k] for k in counts}
    return {k: best[k] - best[counts[0]] for k in counts[1:]}


def time_chunk_loops(model: Any, graph: Graph, members: Sequence[Sequence[str]], gm: Any, *,
                     clock: Callable[[], float] | None = None, counts: Sequence[int] = COUNTS,
                     rounds: int = ROUNDS, max_run_s: float = MAX_RUN_S, total_s: float = TOTAL_S
                     ) -> dict[str, dict[str, float]]:
    """``{call: {k: extra seconds}}`` for each chunkable call of ``graph`` (NOTE [ Chunk loops timed at their
    shapes ]); ``members`` and ``gm``: the trace's fx nodes per cost node and its graph module. ``clock`` times
    the runs and the budgets (default: :func:`run_clock` for the runs, the wall clock for the budgets)."""
    import torch

    wall = clock or time.perf_counter
    clock = clock or run_clock()

    fx = {n.name: n for n in gm.graph.nodes}
    rate = (graph.meta.get(COSTS_META) or {}).get("flops_per_s")
    calls: list[tuple[str, int, int, str | None]] = []
    try:
        tail = find_tail(graph)
        calls.append((tail.head + LOSS_SUFFIX, tail.first, len(graph) - 1, _kind(graph, tail.head)))
    except ChunkError:
        pass
    calls += [(sp.module, sp.first, sp.last, None) for sp in find_calls(graph)]
    out: dict[str, dict[str, float]] = {}
    seen: dict[tuple, str] = {}
    started = wall()
    flush = CacheFlush()
    for name, first, last, kind in calls:
        path = name.removesuffix(LOSS_SUFFIX)
        is_tail = name.endswith(LOSS_SUFFIX)
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        value = _entry_value(graph, members, fx, first, last)
        vocab = _vocabulary(graph, members, fx) if is_tail else None
        params = list(module.parameters())
        flops = sum(nd.fwd_flops + nd.bwd_flops for nd in graph.nodes[first:last + 1])
        if value is None or (is_tail and (kind is None or not vocab)) or not params \
                or any(p.device.type != "cpu" for p in params) \
                or not isinstance(rate, (int, float)) or rate <= 0 or flops / rate > max_run_s:
            continue
        rows = max_chunks(graph, first, last)
        fused = False
        if is_tail:
            full = fused_layer(fused_heads(graph.meta), path) if is_fused(graph, path) else None
            fused = full is not None and fusable(model.get_submodule(full))
        # 1: the call whole, as traced; a fused head is timed whole too (its count 1), against the traced one (0)
        ks = ((0,) if fused else ()) + (1,) + tuple(k for k in counts if 1 < k <= rows)
        if len(ks) < 2:
            continue
        same = (type(module).__qualname__, is_tail, kind, tuple(value.shape), str(value.dtype),
                tuple((n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()), ks)
        if same in seen:  # a call like one timed (every layer's MLP): its figures
            out[name] = dict(out[seen[same]])
            continue
        if wall() - started > total_s:
            log.info("chunk loops: %.1f s spent timing; %s is priced by its formula", wall() - started, name)
            continue
        grads = [p.grad for p in params]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            x = torch.randn(tuple(value.shape), dtype=value.dtype).requires_grad_()
            if is_tail:
                labels = torch.randint(0, vocab, tuple(value.shape[:-1]))
                layer = full[len(path) + 1:] if fused and full != path else ""

                def run(k: int) -> None:
                    for p in params:
                        p.grad = None
                    x.grad = None
                    if k == (0 if fused else 1):  # the head whole, and the loss as transformers computes it
                        logits = module(x).float()
                        y = labels
                        if kind == "causal":
                            logits, y = logits[..., :-1, :], labels[..., 1:]
                        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
                    elif fused:  # NOTE [ Fused head ] in solvers.model.fused: the loop the plan runs
                        loss = fused_head_loss(module, x, labels, kind, k, layer=layer)
                    else:
                        loss = chunked_head_loss(module, x, labels, kind, k)
                    loss.backward()
            else:
                with torch.no_grad():
                    g = torch.randn_like(module(x))

                def run(k: int) -> None:
                    for p in params:
                        p.grad = None
                    x.grad = None
                    if k == 1:
                        y = module(x)
                    else:  # as ChunkedCall joins its chunks
                        y = torch.cat(over_chunks(module, x.reshape(-1, x.shape[-1]), k=k), 0).view(g.shape)
                    y.backward(g)
            try:
                with no_collection():
                    seconds = _seconds(run, ks, clock, rounds, flush, wall=wall)
            except Exception as exc:  # a call that does not run so: priced by the formula
                log.info("could not time the chunk loop of %s (%s: %s); priced by its formula", name,
                         type(exc).__name__, exc)
                continue
            finally:
                for p, grad in zip(params, grads):
                    p.grad = grad
        if seconds is None:
            log.info("the chunk loop of %s takes over %.1f s a pass; priced by its formula", name, MAX_PASS_S)
            continue
        # a fused head's counts may save time (below the traced call's); another call's loop never does
        out[name] = {str(k): s if fused else max(0.0, s) for k, s in seconds.items() if math.isfinite(s)}
        seen[same] = name
        log.info("timed the chunk loop of %s at its shape: %s", name,
                 ", ".join(f"{k} chunks +{1e3 * s:.1f} ms" for k, s in out[name].items()))
    return out


def with_chunk_times(graph: Graph, times: Mapping[str, Mapping[str, float]]) -> Graph:
    """``graph`` with ``times`` as its chunk loops' figures (``meta["costs"]["chunk_times"]``)."""
    import dataclasses

    costs = dict(graph.meta.get(COSTS_META) or {})
    costs[CHUNK_TIMES_KEY] = {name: dict(t) for name, t in times.items()}
    return dataclasses.replace(graph, meta={**graph.meta, COSTS_META: costs})
