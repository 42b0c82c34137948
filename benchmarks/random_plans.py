"""Random plans of every kind over a traced random module, and one real step of each against ``simulate``.

A plan is drawn from what the traced graph offers (``draw_plan``):

* ``store-all``: no region (the trace's own prediction);
* ``regions``: disjoint submodule calls (``graph.spans``), one level;
* ``kept``: regions that keep some op outputs (``Plan.saved``: selective recompute), drawn from the
  nodes a policy can keep (``Graph.saveable``) that the recompute reaches (``recompute_reach``);
* ``chunked``: row-wise calls (an MLP's, ``solvers.model.chunks.find_calls``) run in k chunks, each chunk
  a region or not, with regions elsewhere;
* ``nested``: regions with calls inside them checkpointed again (``Plan.inner``);
* ``mixed``: all of the above in one plan where the graph allows;

each for the loop the caller draws (``held`` or ``dropped``: NOTE [ The user's loop ]).

``run_pair`` applies the plan onto a fresh copy of the module, runs one step in the plan's loop, and
compares it with the unplanned twin's step from the same weights, buffers and seed: the loss, every
parameter gradient and every buffer (BatchNorm statistics), bitwise, or within :data:`CHUNK_RTOL`
relative for a chunked plan (its sums over rows are reassociated: NOTE [ Chunked head ]); then it
measures the step's peak by the allocator (``allocator_step_peak``, the profiler's memory events) and
by live tensor storages, beside ``simulate``'s prediction.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from graphs import Graph
from solvers import Plan, PlanError, simulate
from solvers.model.chunks import expand, find_calls, parse_chunk_module
from solvers.model.selective import recompute_reach
from solvers.model.spans import SpanIndex
from solvers.model.terms import terms_of
from solvers.model.nested import _is_call

__all__ = ["KINDS", "CHUNK_RTOL", "Outcome", "draw_plan", "plan_kind", "inner_input_saved_inside", "run_pair"]

#: The plan kinds :func:`draw_plan` draws.
KINDS = ("store-all", "regions", "kept", "chunked", "nested", "mixed")
#: Relative tolerance on the loss and gradients of a chunked plan (sums over rows reassociated).
CHUNK_RTOL = 1e-6


def _disjoint(rng: random.Random, spans: Sequence[tuple[int, int]], p: float) -> list[tuple[int, int]]:
    """A random set of disjoint spans, each taken with probability ``p`` in a random order."""
    order = list(spans)
    rng.shuffle(order)
    taken: list[tuple[int, int]] = []
    for a, b in order:
        if rng.random() < p and all(b < x or a > y for x, y in taken):
            taken.append((a, b))
    return sorted(taken)


def _names(graph: Graph) -> dict[tuple[int, int], list[str]]:
    out: dict[tuple[int, int], list[str]] = {}
    for sp in graph.spans:
        out.setdefault((sp.first, sp.last), []).append(sp.module)
    return out


def _inner_choices(graph: Graph, a: int, b: int) -> list[tuple[int, int]]:
    """Spans strictly inside ``a..b`` that are single calls (an inner region may be any of them)."""
    names = _names(graph)
    outer = graph.span_module((a, b))
    return [r for r, ms in names.items() if a <= r[0] and r[1] <= b and r != (a, b)
            and all(_is_call(m) for m in ms) and graph.span_module(r) != outer]


def _keepable(graph: Graph, a: int, b: int) -> list[int]:
    reach = recompute_reach(graph)
    ok = graph.saveable
    return [i for i in range(a, min(b, reach[b]) + 1) if ok[i]]


def draw_plan(graph: Graph, kind: str, seed: int, loop: str, *, rows: int | None = None) -> Plan | None:
    """A random plan of ``kind`` over ``graph`` for ``loop``; None when the graph offers no such plan.

    ``rows``: the token rows of the step; chunk counts are then drawn among those that divide them (where
    the prediction claims exactness, NOTE [ Chunked head ]); None draws 2, 3 or 4 whatever the rows."""
    rng = random.Random(seed)
    graph = graph.with_loop(loop)
    if kind == "store-all":
        return Plan.from_regions(graph, [])
    chunks: tuple[tuple[int, int, int], ...] = ()
    if kind in ("chunked", "mixed"):
        calls = list(find_calls(graph))
        if not calls:
            if kind == "chunked":
                return None
        else:
            picked = [sp for sp in calls if rng.random() < 0.7] or [rng.choice(calls)]
            counts = [k for k in (2, 3, 4) if rows is None or rows % k == 0] or [2]
            chunks = tuple((sp.first, sp.last, rng.choice(counts)) for sp in picked)
    work = expand(graph, chunks)
    spans = SpanIndex(work).spans
    if not spans:
        return None
    for _ in range(20):
        regions = _disjoint(rng, spans, rng.choice((0.3, 0.6)))
        if kind == "chunked":  # at least one chunk checkpointed
            chunk_spans = [(sp.first, sp.last) for sp in work.spans if parse_chunk_module(sp.module)]
            regions = sorted(set(regions) | {rng.choice(chunk_spans)}) if chunk_spans else regions
            regions = _drop_overlaps(regions)
        if not regions:
            continue
        inner: list[tuple[int, int]] = []
        saved: list[int] = []
        for a, b in regions:
            nest = kind == "nested" or (kind == "mixed" and rng.random() < 0.4)
            choices = _inner_choices(work, a, b) if nest else []
            if choices:
                inner += _disjoint(rng, choices, 0.6) or [rng.choice(choices)]
                continue
            if kind in ("kept", "mixed") and not parse_chunk_module(work.span_module((a, b))):
                keep = _keepable(work, a, b)
                saved += [i for i in keep if rng.random() < 0.4]
        if kind == "nested" and not inner or kind == "kept" and not saved:
            continue
        try:
            return Plan.from_regions(graph, regions, saved=tuple(saved), inner=tuple(_drop_overlaps(sorted(inner))),
                                     chunks=chunks)
        except PlanError:
            continue  # e.g. a kept node the recompute does not reach: draw again
    return None


def _drop_overlaps(regions: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(regions, key=lambda r: (r[1] - r[0], r[0])):
        if all(b < x or a > y for x, y in out):
            out.append((a, b))
    return sorted(out)


def plan_kind(plan: Plan) -> str:
    """The kind of a drawn plan, read from its fields (a ``mixed`` draw may give a simpler one)."""
    levers = [name for name, on in (("chunked", plan.chunks), ("nested", plan.inner), ("kept", plan.saved)) if on]
    if len(levers) > 1:
        return "mixed"
    return levers[0] if levers else ("regions" if plan.regions else "store-all")


def inner_input_saved_inside(graph: Graph, plan: Plan) -> bool:
    """Whether an inner region of ``plan`` has an input made by its outer's recompute that a node inside it
    saves: ``simulate`` releases that input when the inner region's recompute ends, though the node's
    backward still reads it (the NESTED rule of issue 33, fixed on its own branch)."""
    g = expand(graph, plan.chunks)
    saves = terms_of(g).saves
    for x, y in plan.inner:
        a = max(ra for ra, _ in plan.regions if ra <= x)  # its outer region: the inputs its recompute makes
        inputs = {j for k in range(x, y + 1) for j in g.preds[k] if a <= j < x}
        if any(j in inputs for k in range(x, y + 1) for j in saves[k]):
            return True
    return False


@dataclass(frozen=True)
class Outcome:
    """One (module, plan) pair, run.

    Attributes:
        predicted: ``simulate(graph, plan).peak_bytes``.
        allocator: the allocator's peak of the planned step (profiler memory events).
        storages: the same step's peak by live tensor storages.
        equal: loss, gradients and buffers equal to the unplanned twin's (bitwise, or within
            :data:`CHUNK_RTOL` for a chunked plan).
        worst: largest relative difference of the loss and gradients (0.0 when bitwise).
        error: the exception a step raised (its type and first line), or "".
        requested: on CUDA, the peak of the bytes the step's tensors and kernels asked the allocator for
            (``requested_bytes``: before it rounds each block up to 512 B), with what was allocated before; else
            None.
    """

    predicted: int
    allocator: int = 0
    storages: int = 0
    equal: bool = False
    worst: float = 0.0
    error: str = ""
    requested: int | None = None

    @property
    def over(self) -> int:
        """Allocator minus prediction: positive when the step ran over its prediction."""
        return self.allocator - self.predicted


def _state(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, {n: b.detach().clone() for n, b in model.named_buffers()}


def _compare(a: torch.Tensor, b: torch.Tensor, scale: float | None = None) -> float:
    """0.0 when bitwise equal, else the largest difference relative to ``scale`` (default: ``b``'s largest
    entry). Gradients are compared relative to the model's largest gradient entry: a gradient that is
    zero but for rounding (a convolution's bias before a BatchNorm) has no scale of its own."""
    if a.shape != b.shape:
        return float("inf")
    if torch.equal(a, b):
        return 0.0
    top = float(b.abs().max()) if scale is None else scale
    return float((a.double() - b.double()).abs().max()) / max(top, 1e-30)


def _requested_peak(module: torch.nn.Module, args: tuple, loss: Any, loop: str) -> int:
    """On CUDA: the peak of ``requested_bytes`` over one step, plus the step's tensors allocated before it."""
    from scheduler.measuring.storages import live_bytes_of
    from scheduler.measuring.training import clear_grads, step_tensors, training_step

    clear_grads(module)
    live = step_tensors(module, args, {})
    device = next(t.device for t in live if t.device.type == "cuda")
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_stats(device).get("requested_bytes.all.current", 0)
    torch.cuda.reset_peak_memory_stats(device)
    training_step(module, args, {}, loss, loop=loop)
    torch.cuda.synchronize(device)
    return torch.cuda.memory_stats(device)["requested_bytes.all.peak"] - base + live_bytes_of(live)


def run_pair(model: torch.nn.Module, args: tuple, loss: Any, graph: Graph, plan: Plan, *, seed: int = 0,
             rtol: float = 0.0) -> Outcome:
    """Apply ``plan`` onto a copy of ``model``, step it and its unplanned twin, measure (see the module's doc).
    ``rtol``: the relative difference still counted as equal (a GPU's non-deterministic kernels); a chunked plan
    allows :data:`CHUNK_RTOL` at least."""
    import scheduler
    from scheduler.measuring.steps import allocator_step_peak, measure_step_peak
    from scheduler.measuring.training import training_step

    g = graph.with_loop(plan.loop or graph.loop)
    predicted = simulate(g, plan).peak_bytes
    twin, planned = copy.deepcopy(model), copy.deepcopy(model)
    loop = plan.loop or "held"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if plan.regions or plan.chunks:
                scheduler.apply(planned, plan)
            results = []
            for m in (twin, planned):
                m.zero_grad(set_to_none=True)
                torch.manual_seed(seed)
                value = training_step(m, args, {}, loss, loop=loop)
                results.append((value, *_state(m)))
            allocator = allocator_step_peak(planned, planned, args, {}, loss, loop=loop)
            storages = measure_step_peak(planned, planned, args, {}, loss, loop=loop)
            cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            requested = _requested_peak(planned, args, loss, loop) if cuda else None
    except Exception as exc:  # noqa: BLE001 - a failing step is an outcome to report
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Outcome(predicted=predicted, error=f"{type(exc).__name__}: {first}")
    (l0, g0, b0), (l1, g1, b1) = results
    worst = _compare(l1, l0)
    if g0.keys() != g1.keys() or b0.keys() != b1.keys():
        worst = float("inf")
    else:
        scale = max((float(g.abs().max()) for g in g0.values() if g.numel()), default=0.0)
        worst = max([worst] + [_compare(g1[n], g0[n], scale) for n in g0])
    tol = max(rtol, CHUNK_RTOL if plan.chunks else 0.0)
    buffers = all(_compare(b1[n], b0[n]) <= tol for n in b0)
    equal = buffers and worst <= tol
    return Outcome(predicted=predicted, allocator=allocator, storages=storages, equal=equal, worst=worst,
                   requested=requested)


def replace_loop(plan: Plan, loop: str) -> Plan:
    """``plan`` for another loop (its prediction is simulated again by :func:`run_pair`)."""
    return dataclasses.replace(plan, loop=loop)
